{%- from "replay_matrix.jinja" import description, kind, rb with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
{%- set key = c.operation_key_name -%}
# frozen_string_literal: true

# loaded now: its lazy load on first use is not thread-safe (ruby/digest#57)
require "digest/sha2"
require "json"
require "sidekiq/api"

module {{ mod }}
  # Once per {{ key }}:
  # {{ description }}.
  #
  #   {{ mod }}::{{ job }}.enqueue({{ rb(c.example_key) }}, details)
  #
  # enqueue writes the operation's record first (queued, with its details), then pushes the message, the key and
  # its details. A message pushed without it (perform_async with the key alone) still works: the details are
  # then Effect.details_for(key). The job claims the key in `{{ c.record_table }}`, performs the effect, and
  # marks the claim completed; a delivery that finds the key already claimed or done does nothing (POLICY.md).
  class {{ job }}
    include Sidekiq::Job

    # Retries are for an effect that failed (the provider was down), the claim released first so that the retry
    # can claim it again, and for a database that could not be reached. Sidekiq waits (count**4) + 15 s or more
    # before retry `count`: 8 retries span at least 79 minutes, so a database outage shorter than that delays
    # the job and loses nothing (after the last, it is in Sidekiq's dead set). A bad message or a conflict is
    # never retried: a retry cannot fix it.
    sidekiq_options queue: "default", retry: 8

{%- if kind.one_transaction %}

    # Sidekiq gave up: the effect's error rolled the claim back with the transaction, so the record is as it was
    # before the claim: none (the message was pushed without enqueue) or queued. A queued one becomes failed with
    # the last error, for a person (the held list shows it, and resolves it); else the sweeper would send it
    # again and again, and no list would show it.
{%- else %}

    # Sidekiq gave up: the failing effect left the record released; it becomes failed with the last error, for a
    # person (the held list shows it, and resolves it). Without this it would sit released, in no one's list.
{%- endif %}
    sidekiq_retries_exhausted do |message, error|
      key = message["args"].first
      # The error's first 1,000 characters: enough to act on, and a note stays small.
      {{ mod }}.claims.fail(key, "#{error.class}: #{error.message}"[0, 1000]) if key.is_a?(String)
    end

    # A message that can never succeed: refused with a clear error, before any claim or effect.
    class BadMessage < StandardError; end

    # A log line shows at most this many characters of a message's arguments, whatever the message carries.
    LOGGED_ARGUMENTS = 200

    # The app's way to send: writes the record as queued, with the details' fingerprint and the details as JSON,
    # then pushes the message. Inside an open ActiveRecord transaction the record is written in it and the
    # message pushed once it commits (never on rollback), so the operation is asked for exactly when the app's
    # data commits. A key already recorded is not sent again: nil; else the jid (nil inside a transaction, where
    # the push waits for the commit). Raises Claims::PayloadConflict when the key is recorded with other
    # details, and BadMessage for a key or details that the job would refuse. The sweeper sends a record still
    # queued after RESEND_QUEUED_AFTER_SECONDS again, so a message the broker lost is not lost for good.
    def self.enqueue({{ key }}, details = Effect.details_for({{ key }}))
      job = new
      {{ key }}, details = job.send(:message_from, [{{ key }}, details])
      # As the worker will read them: through JSON.
      payload = job.send(:encoded, details)
      details = JSON.parse(payload)
      fingerprint = job.send(:fingerprint, {{ key }}, details)
      unless {{ mod }}.claims.enqueue({{ key }}, fingerprint, payload)
        Sidekiq.logger.info(
          "{{ c.job_type }} #{ {{- key -}} }: not sent again: the key is known already"
        )
        return
      end

      jid = nil
      # Redis down: QueueUnreachable, and the record stays queued for the sweeper
      {{ mod }}.after_commit { jid = push({{ key }}, details) }
      jid
    end

    # Pushes the message of a recorded key (the send, the sweeper's re-send, a person's release): with the details
    # its record keeps, or the key alone where it keeps none. QueueUnreachable when Redis cannot be reached.
    def self.push({{ key }}, details)
      {{ mod }}.talking_to_the_queue do
        details ? perform_async({{ key }}, details) : perform_async({{ key }})
      end
    end

    def perform(*args)
      {{ key }}, details = message_from(args)
      settle(details) { claim_operation({{ key }}, details) }
    rescue BadMessage, Claims::PayloadConflict => e
      refuse(args, e)
    rescue ActiveRecord::ActiveRecordError => e
      # Raised, so Sidekiq retries the message; one that will not pass by itself (a missing table, a failed login,
      # a permission) is logged at ERROR each time, with what a person must do (Sidekiq's own line is a WARN).
      needed = DatabaseCheck.person_needed(e)
      claims.log(:error, args.first, "#{needed}; Sidekiq retries the message", outcome: "retrying") if needed
      raise
    end

    # The sweeper's entry: applies the policy to a claim it found stale, and performs the effect again when
    # the policy says so{{ " (resend)" if c.stale_claim_policy == "resend" else "" }}{{ " (lookup: only if the provider lacks it)" if c.stale_claim_policy == "lookup" else "" }}.
    def sweep_stale({{ key }}, token)
      settle { claims.apply_policy({{ key }}, token) }
    end

    private

    # Performs the effect under the claim the block takes (nil: nothing to do here), with the message's details or,
    # for the sweeper, those the record keeps; once that is committed, logs it as the Python kits do.
{%- if kind.one_transaction %}
    # The claim, the effect's row and the completion commit together or not at all: a worker that dies part-way
    # leaves nothing behind, and the next delivery does the work once.
    def settle(details = nil)
      claim = claims.transaction do
        taken = yield
        taken if taken && perform_claimed(taken, details || stored_details(taken.key))
      end
{%- else %}
    def settle(details = nil)
      claim = yield
      claim = nil unless claim && perform_claimed(claim, details || stored_details(claim.key))
{%- endif %}
      return unless claim

      claims.log(:info, claim.key, "performed and completed (attempt #{claim.attempt})",
                 outcome: "performed", attempt: claim.attempt)
      claims.notify(claim.key, "performed")
    end

    # [key, details]: the message is the key, and its details when enqueue sent it; else Effect.details_for.
    def message_from(args)
      unless [1, 2].include?(args.size)
        raise BadMessage,
              "expected the {{ key }} (and its details, from enqueue); got #{args.size} arguments"
      end

      key = key_from(args.first)
      details = args.size == 2 ? args.last : Effect.details_for(key)
      raise BadMessage, "the details must be a Hash (a JSON object), not #{details.class}" unless details.is_a?(Hash)

      encoded(details)
      [key, details]
    end

    # Checked before it reaches the database, where it would fail at every retry: a NUL no text column holds,
    # bytes that are not UTF-8 (a raw message can carry them; JSON passes them on).
    def key_from(key)
      raise BadMessage, "{{ key }} must be a string, not #{key.class}" unless key.is_a?(String)
      raise BadMessage, "{{ key }} is not valid UTF-8" unless utf8?(key)

      if key.include?("\0")
        raise BadMessage,
              "{{ key }} contains a NUL character, which no database text column can hold"
      end

      raise BadMessage, "{{ key }} is empty" if key.strip.empty?

      if key.length > MAX_KEY_LENGTH
        raise BadMessage,
              "{{ key }} has #{key.length} characters; at most #{MAX_KEY_LENGTH} fit the record"
      end

      key.encode(Encoding::UTF_8)
    end

    # The details as canonical JSON (keys sorted), as the record keeps them; BadMessage for strings that are not
    # UTF-8, values JSON cannot write (NaN, say), or more than MAX_DETAILS_BYTES of it. (A NUL is written as an
    # escape, which the record holds.)
    def encoded(details)
      raise BadMessage, "the details hold a string that is not valid UTF-8" unless all_utf8?(details)

      payload = JSON.generate(canonical(details))
      limit = {{ mod }}.max_details_bytes
      return payload if payload.bytesize <= limit

      raise BadMessage, "details are #{payload.bytesize} bytes as JSON; at most #{limit} (MAX_DETAILS_BYTES)"
    rescue JSON::JSONError => e
      raise BadMessage, "the details are not plain JSON: #{e.message}"
    end

    def utf8?(text)
      text.encode(Encoding::UTF_8).valid_encoding?
    rescue EncodingError
      false
    end

    def all_utf8?(value)
      case value
      when String then utf8?(value)
      when Hash then value.all? { |name, item| all_utf8?(name.to_s) && all_utf8?(item) }
      when Array then value.all? { |item| all_utf8?(item) }
      else true
      end
    end

    # Logged as an error and not raised: Sidekiq would retry a raised error, and a retry cannot help. In a
    # Sidekiq process the message goes to Sidekiq's dead set with its reason, where a person sees it (the Dead
    # tab); elsewhere (a console, Sidekiq::Testing) there is no Redis it came from.
    def refuse(args, error)
      logger.error("{{ c.job_type }} refused #{excerpt(args)}: #{error.message}")
      claims.notify(args.first.is_a?(String) ? args.first : excerpt(args), "refused")
      return unless Sidekiq.server?

      entry = { "class" => self.class.name, "args" => buried(args), "jid" => jid, "retry" => false,
                "queue" => self.class.get_sidekiq_options["queue"], "failed_at" => failed_at,
                "error_class" => error.class.name, "error_message" => error.message }
      # Sidekiq 6.4 has no `sidekiq_retry_in ... :kill`; this is what a kill from the Web UI does.
      Sidekiq::DeadSet.new.kill(JSON.generate(entry), notify_failure: false)
    end

    # Now, as Sidekiq writes its own timestamps: epoch milliseconds from Sidekiq 8 on, epoch seconds before.
    def failed_at
      Gem::Version.new(Sidekiq::VERSION) >= Gem::Version.new("8") ? (Time.now.to_f * 1000).to_i : Time.now.to_f
    end

    # The arguments for the dead set: as they came, where they are UTF-8, JSON can write them and they weigh no
    # more than an accepted message; else their excerpt (Ruby's inspect escapes any bytes).
    def buried(args)
      return [excerpt(args)] unless all_utf8?(args)

      JSON.generate(args).bytesize <= {{ mod }}.max_details_bytes + 1024 ? args : [excerpt(args)]
    rescue JSON::JSONError
      [excerpt(args)]
    end

    def excerpt(args)
      shown = args.inspect
      return shown if shown.length <= LOGGED_ARGUMENTS

      "#{shown[0, LOGGED_ARGUMENTS]}... (#{shown.length} characters)"
    end

    # The details the record was sent with (by enqueue), else Effect.details_for: the sweeper acts as a
    # redelivery of the message would.
    def stored_details({{ key }})
      claims.details({{ key }}) || Effect.details_for({{ key }})
    end

    # The claim's statement, timed for an app's metrics: the event "claim.replay_matrix" (its duration).
    def claim_operation({{ key }}, details)
      ActiveSupport::Notifications.instrument(
        "claim.replay_matrix", job_type: claims.job_type, operation_key: {{ key }}
      ) { claims.claim({{ key }}, fingerprint({{ key }}, details)) }
    end

    # True when this run performed the effect and completed the record.
    def perform_claimed(claim, details)
{%- if c.stale_claim_policy == "lookup" %}
      # Taken over from a run that may have died after the effect: ask the provider before sending again.
      if claim.taken_over && Effect.performed?(claim.key)
        claims.log(:warn, claim.key, "the provider has it already; completed without sending again",
                   outcome: "skipped", attempt: claim.attempt)
        claims.notify(claim.key, "skipped")
        complete_operation(claim)
        return false # completed, not performed here
      end

{%- endif %}
      perform_effect(claim, details)
      complete_operation(claim)
    end
{% if kind.one_transaction %}
    # Raises when the database cannot be reached: the transaction is lost, claim and row with it, and Sidekiq's
    # retry performs the operation once.
{%- else %}
    # False when this run no longer holds the claim (a run frozen past the lease woke up: the policy was applied
    # meanwhile). Raises when the database cannot be reached: the claim stays, Sidekiq's retry finds it young and
    # leaves it, and after the lease the policy applies, as to a worker that died after the effect.
{%- endif %}
    def complete_operation(claim)
      claims.complete(claim)
    end

    def perform_effect(claim, details)
      Effect.perform(claim.key, details)
{%- if not kind.one_transaction %}
    rescue StandardError => e
      # An effect that raised did not happen: release the claim so that Sidekiq's retry can claim it again.
      claims.release(claim, "#{e.class}: #{e.message}")
      raise
{%- endif %}
    end

    # sha256 of the key and its details, written canonically (keys sorted at every level: the outer two are
    # written in order) so that equal payloads always match.
    def fingerprint({{ key }}, details)
      payload = { "details" => canonical(details), "key" => {{ key }} }
      Digest::SHA256.hexdigest(JSON.generate(payload))
    end

    def canonical(value)
      case value
      when Hash then value.to_h { |name, item| [name.to_s, canonical(item)] }.sort.to_h
      when Array then value.map { |item| canonical(item) }
      else value
      end
    end

    def claims
      {{ mod }}.claims
    end
  end
end
