{%- from "replay_matrix.jinja" import rb, kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

require "open3"
require "socket"

# The paths around the seven cases: a conflicting payload, an effect that fails, the sweeper with nothing to
# do, and a person resolving a held operation. They call the job in this process, on the suite's database.
RSpec.describe "{{ c.job_type }} operations" do
  let(:kit) { {{ mod }} }
  let(:job) { ReplayHarness::JOB.new }
  let(:key) { {{ rb(c.example_key) }} }

  it "refuses the same key with other details as a conflict: logged, nothing done, the record kept" do
    queue.deliver(key)
    allow(kit::Effect).to receive(:details_for).and_return({ "to" => "someone-else@example.com" })

    _, log = logged(SUITE_LOG) { job.perform(key) }

    expect(log).to match(/ERROR.*{{ c.job_type }} #{Regexp.escape(key)}: conflict/)
    expect(effects.count).to eq(1)
    expect(record(key)).to eq("completed")
  end

  it "leaves no claim behind when the effect fails, so Sidekiq's retry performs it once" do
    calls = 0
    allow(kit::Effect).to receive(:perform).and_wrap_original do |original, *args|
      calls += 1
      raise IOError, "the provider is down" if calls == 1

      original.call(*args)
    end

    expect { job.perform(key) }.to raise_error(IOError, "the provider is down")
{%- if kind.one_transaction %}
    expect(record(key)).to eq("none") # the transaction rolled back
{%- else %}
    expect(record(key)).to eq("released")
{%- endif %}
    job.perform(key) # the retry
    expect(effects.count).to eq(1)
    expect(record(key)).to eq("completed")
  end

  it "reports what became of each operation as an event, and times each claim" do
    events = []
    record = lambda do |name, _started, _finished, _id, payload|
      events << [name, payload.slice(:job_type, :operation_key, :outcome)]
    end
    holding = kit::Claims.new(job_type: kit::JOB_TYPE, table: kit::RECORD_TABLE, lease_seconds: kit::LEASE_SECONDS,
                              policy: "hold", logger: Sidekiq.logger)
    ActiveSupport::Notifications.subscribed(record, /\.replay_matrix\z/) do
      2.times { job.perform(key) }
      stale = holding.claim("STALE-1", "fingerprint")
      age_past_lease("STALE-1")
      holding.apply_policy("STALE-1", stale.token)
      allow(kit::Effect).to receive(:details_for).and_return({ "to" => "someone-else@example.com" })
      job.perform(key)
    end

    ids = { job_type: kit::JOB_TYPE, operation_key: key }
    # an event inside another (a skip is decided inside the claim) comes first, as it ends first
    expect(events).to eq([["claim.replay_matrix", ids], ["operation.replay_matrix", ids.merge(outcome: "performed")],
                          ["operation.replay_matrix", ids.merge(outcome: "skipped")], ["claim.replay_matrix", ids],
                          ["operation.replay_matrix", ids.merge(operation_key: "STALE-1", outcome: "held")],
                          ["claim.replay_matrix", ids], ["operation.replay_matrix", ids.merge(outcome: "refused")]])
  end

  it "writes each line's key, attempt and outcome into Sidekiq's log context, which its formatters show as fields" do
    _, log = logged(SUITE_LOG) { 2.times { job.perform(key) } }

    fields = "operation_key=#{Regexp.escape(key)}"
    expect(log).to match(/#{fields} attempt=1 outcome=performed\b.*: performed and completed \(attempt 1\)/)
    expect(log).to match(/#{fields} outcome=skipped\b.*: skipped: already completed/)
  end

  it "sweeps nothing while every claim is young" do
    kit.claims.claim(key, "fingerprint")
    expect(kit::StaleClaimSweeperJob.sweep).to eq(0)
    expect(record(key)).to eq("claimed")
  end

  describe "a person resolving a held operation" do
    # A stale claim held for a person, as the hold policy leaves it (set up with that policy whatever this
    # kit's policy is: the person's task serves every kit).
    before do
      holding = kit::Claims.new(job_type: kit::JOB_TYPE, table: kit::RECORD_TABLE, lease_seconds: kit::LEASE_SECONDS,
                                policy: "hold", logger: Sidekiq.logger)
      claim = holding.claim(key, job.send(:fingerprint, key, kit::Effect.details_for(key)))
      age_past_lease(key)
      holding.apply_policy(key, claim.token)
    end

    it "lists it" do
      listing = StringIO.new
      held = kit::HeldOperations.list(listing)
      expect(held.map(&:key)).to eq([key])
      expect(listing.string).to include(key, "attempt 1", "held for a person")
    end

    it "marks it done, recording who and why, and nothing is sent" do
      kit::HeldOperations.resolve(key, done: true, by: "alice", why: "the customer confirmed the email")

      row = ActiveRecord::Base.connection.select_one("SELECT * FROM {{ c.record_table }}")
      expect(row).to include("status" => "completed", "resolved_by" => "alice")
      expect(row["resolved_at"]).not_to be_nil
      expect(row["note"]).to include("the customer confirmed the email")
      expect(effects.count).to eq(0)
      expect(kit::HeldOperations.list(StringIO.new)).to be_empty
    end

    it "releases it for one more attempt, which performs it once" do
      jid = kit::HeldOperations.resolve(key, done: false, by: "bob", why: "the provider never got it")
      queue.finish(jid)

      expect(effects.count).to eq(1)
      expect(record(key)).to eq("completed")
    end

    it "keeps every resolution: the name given, who the machine and the database knew, the states, why" do
      jid, log = logged(SUITE_LOG) do
        kit::HeldOperations.resolve(key, done: false, by: "bob", why: "the provider never got it")
      end
      queue.finish(jid) # performed before the next example begins
      postgresql = ActiveRecord::Base.connection.adapter_name == "PostgreSQL"
      role = postgresql ? ActiveRecord::Base.connection.select_value("SELECT current_user") : "-"
      me = kit::HeldOperations.os_identity
      expect(log).to include("{{ c.job_type }} #{key}: resolved by bob as #{me} " \
                             "(database role #{role}): held -> queued: the provider never got it")

      listing = StringIO.new
      kit::HeldOperations.resolutions(key, listing)
      *rows, count = listing.string.lines(chomp: true)
      expect(rows.map { |row| row.split("\t").values_at(0, 2..) })
        .to eq([[key, "bob", me, role, "held -> queued", "the provider never got it"]])
      expect(count).to eq("1 resolutions")
    end

    # The person's tasks that push, with Redis down (nothing listens on its port): one line each, and nothing
    # lost: a send records nothing, a release and a sweep leave the record queued for the next sweep.
    it "says in one line when Redis cannot be reached, and leaves each record as the line says", if: !LIVE do
      closed = Socket.new(:INET, :STREAM)
      closed.bind(Addrinfo.tcp("127.0.0.1", 0))
      env = { "REDIS_URL" => "redis://127.0.0.1:#{closed.local_address.ip_port}/0" }
      rake = lambda do |task, *args|
        Open3.capture3(env, RbConfig.ruby, "-S", "rake", "{{ c.project_slug }}:#{task}", *args,
                       chdir: File.join(__dir__, ".."))
      end
      unreachable = /Redis cannot be reached \(.*refused.*\): check that it runs where REDIS_URL points; /i
      status_task = "`rake {{ c.project_slug }}:status`"
      later = "not sent now (Redis cannot be reached): its record is queued: the sweeper sends it again after " \
              "#{kit.resend_queued_after} s (#{status_task} shows it)"

      _, err, status = rake.call("enqueue", "KEY=NEW-1") # (Sidekiq 7 and later log their connecting on stdout)
      expect([status.exitstatus, err.lines.size]).to eq([2, 1]), err
      expect(err).to match(/\A\S+:enqueue: #{unreachable}nothing sent, nothing recorded\n\z/)
      expect(record("NEW-1")).to eq("none")

      out, err, status = rake.call("held:resolve", "KEY=#{key}", "DONE=no", "BY=bob", "WHY=again")
      expect(status).to be_success, err
      expect(out.lines.last).to eq("#{kit::JOB_TYPE} #{key}: queued, #{later}\n")
      expect(record(key)).to eq("queued")

      age_past_lease(key) # past the re-send time (the lease)
      _, err, status = rake.call("sweep")
      expect([status.exitstatus, err.lines.size]).to eq([2, 1]), err
      expect(err).to match(/\A\S+:sweep: #{unreachable}#{status_task} shows what is queued\n\z/)
      expect(record(key)).to eq("queued")
    ensure
      closed&.close
    end

    it "refuses to resolve a key that is not held, or without who and why" do
      expect { kit::HeldOperations.resolve("NOT-HELD", done: true, by: "alice", why: "x") }
        .to raise_error(ArgumentError, /not held/)
      expect { kit::HeldOperations.resolve(key, done: true, by: "", why: "x") }
        .to raise_error(ArgumentError, /who/)
    end
  end
end
