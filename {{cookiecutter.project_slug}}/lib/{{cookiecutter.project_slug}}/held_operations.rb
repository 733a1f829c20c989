{%- from "replay_matrix.jinja" import states -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
{%- set key = c.operation_key_name -%}
{%- set for_a_person = [] -%}
{%- set due = [] -%}
{%- for state, fact in states.items() -%}
  {%- if fact.get("person") %}{% set _ = for_a_person.append(state) %}{% endif -%}
  {%- if fact.get("due") %}{% set _ = due.append('"' ~ state ~ '" => :' ~ fact.due) %}{% endif -%}
{%- endfor -%}
# frozen_string_literal: true

require "etc"
require "socket"

module {{ mod }}
  # A person's task: list the operations of `{{ c.job_type }}` that wait for a person (held, and
  # failed past Sidekiq's retries), and resolve one, recording who and why
  # (`rake {{ c.project_slug }}:held:list`, `rake {{ c.project_slug }}:held:resolve`).
  # And a monitor's: the count and oldest age of each state (`rake {{ c.project_slug }}:status`).
  module HeldOperations
    # The states a person must look at; the status fails on any record in them.
    FOR_A_PERSON = %w[{{ for_a_person|join(" ") }}].freeze
    # How long a record may sit in a state before the status calls it overdue: the re-send time or the lease.
    DUE = { {{ due|join(", ") }} }.freeze
    # The states of a record, in the order an operation meets them (POLICY.md).
    STATES = %w[{{ states|join(" ") }}].freeze

    # One line of the status: how many records are in `state`, the age in seconds of the oldest (nil when none)
    # and how many of them sit past their time.
    StateCount = Struct.new(:state, :records, :oldest, :overdue, keyword_init: true)

    module_function

    # One line per operation, then the count: "2 held", or "2 held, 1 failed".
    def list(out = $stdout)
      waiting = {{ mod }}.claims.held
      waiting.each do |op|
        out.puts([op.key, op.status, "attempt #{op.attempt}", "claimed #{op.claimed_at} UTC", op.note].join("\t"))
      end
      failed = waiting.count { |op| op.status == "failed" }
      out.puts(["#{waiting.size - failed} held", ("#{failed} failed" if failed.positive?)].compact.join(", "))
      waiting
    end

    # done: the person checked that the effect happened (completed). Otherwise the operation is queued again,
    # with a new token and its attempt kept, and its job pushed at once for one more attempt: the jid is returned.
    # Each resolution is kept in {{ c.record_table }}_resolutions and logged in one line:
    # the name given, who the machine knew (`by` is free text), the database's role, the states before and after,
    # and why.
    # `resolved_as` is who the system knows the person as: the OS user of a rake task, the app's user of the
    # Sidekiq Web tab (Web).
    def resolve({{ key }}, done:, by:, why:, resolved_as: os_identity)
      raise ArgumentError, "say who resolves it (BY) and why (WHY)" if by.to_s.strip.empty? || why.to_s.strip.empty?

      resolved = {{ mod }}.claims.resolve(
        {{ key }}, done: done, by: by, why: why, resolved_as: resolved_as
      )
      unless resolved
        raise ArgumentError,
              "{{ c.job_type }} #{ {{- key -}} } is not held or failed"
      end

      {{ mod }}.claims.log(
        :warn, {{ key }},
        "resolved by #{by} as #{resolved_as} (database role #{resolved['database_role'] || '-'}): " \
        "#{resolved['status_before']} -> #{resolved['status_after']}: #{why}",
        outcome: "resolved"
      )
      return if done

      send_again({{ key }}, resolved["details"])
    end

    # A released operation's message, sent now; Redis unreachable, it waits (queued) for the sweeper. The jid or nil.
    def send_again({{ key }}, details)
      {{ job }}.push({{ key }}, details)
    rescue QueueUnreachable => e
      {{ mod }}.claims.log(
        :warn, {{ key }}, "released, not sent now: #{e.message}", outcome: "queued"
      )
      nil
    end

    # What a decision did, for the rake task's line and the Web tab's page: `jid` is resolve's answer.
    def outcome(done, jid)
      return "marked done" if done
      return "queued and sent again (jid #{jid})" if jid

      "queued, not sent now (Redis cannot be reached): #{ {{- mod -}} .queued_for_the_sweeper}"
    end

    # Every resolution by a person, of one key or of all (nil), oldest first: a line each, then the count.
    def resolutions({{ key }} = nil, out = $stdout)
      found = {{ mod }}.claims.resolutions({{ key }})
      found.each do |row|
        out.puts([row["key"], "#{row['resolved_at']} UTC", row["resolved_by"], row["resolved_as"],
                  row["database_role"] || "-", "#{row['status_before']} -> #{row['status_after']}",
                  row["why"]].join("\t"))
      end
      out.puts("#{found.size} resolutions")
      found
    end

    # Who runs this, as the machine knows them: the OS user at the host.
    def os_identity
      user = Etc.getpwuid(Process.uid)&.name || "uid #{Process.uid}"
      "#{user}@#{Socket.gethostname}"
    end

    # Prints a line per state (count, age of the oldest) and a verdict; true when nothing waits for a person
    # and nothing sits past its time.
    def status(out = $stdout)
      resend = {{ mod }}.resend_queued_after
      counts = state_counts(resend)
      counts.each do |line|
        # whole seconds, rounded as the Python kits print them
        age = line.oldest ? format("%.0fs", [line.oldest, 0].max) : "-"
        out.puts(format("%<state>-10s %<records>7d  %<age>s", state: line.state, records: line.records, age: age))
      end
      problems = attention(counts, resend)
      out.puts(problems.empty? ? "ok: nothing waits for a person or sits past its time" : "attention: #{problems}")
      problems.empty?
    end

    # A StateCount per state, in STATES' order.
    def state_counts(resend)
      found = {{ mod }}.claims.status(resend_after: resend)
      STATES.map do |state|
        row = found.fetch(state, {})
        StateCount.new(state: state, records: row["count"].to_i, oldest: row["oldest"]&.to_f,
                       overdue: row["overdue"].to_i)
      end
    end

    # "1 held, 2 queued past 600 s": only what is not zero, the states for a person first.
    def attention(counts, resend)
      by_state = counts.to_h { |line| [line.state, line] }
      waiting = FOR_A_PERSON.map { |state| [by_state[state].records, state] }
      late = DUE.map do |state, due|
        seconds = due == :resend ? resend : {{ mod }}::LEASE_SECONDS
        [by_state[state].overdue, "#{state} past #{seconds} s"]
      end
      (waiting + late).select { |count, _| count.positive? }.map { |count, what| "#{count} #{what}" }.join(", ")
    end
  end
end
