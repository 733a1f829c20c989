{%- from "replay_matrix.jinja" import rb, kind, policy with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set takeover = c.stale_claim_policy in ["resend", "lookup"] -%}
# frozen_string_literal: true

# Faults beyond the seven rows, live only (SQLite has no server to lose): the database lost at the claim and at
# the completion, the record table taken away from a running worker, a worker frozen past its
# lease{{ ", the sweeper and a redelivery at the same stale claim" if not kind.one_transaction else "" }}.
# This file's own sidekiq process takes the queue "faults" on one thread and reaches PostgreSQL through a TCP
# proxy (db_proxy.rb): stopping the proxy refuses its connections and cuts the open ones, for real, and the next
# job must open another. Effects are counted where they arrive; the record is read on the suite's own
# connection, which does not go through the proxy.
return unless LIVE

require_relative "db_proxy"

RSpec.describe "{{ c.job_type }} under database faults and frozen workers" do
  key = {{ rb(c.example_key) }}
  sweeper = {{ mod }}::StaleClaimSweeperJob

  before(:all) do
    @proxy = DbProxy.new(ENV.fetch("DATABASE_URL")).start
    @worker = ReplayHarness::LiveQueue.new(WORKER_ENV, File.join(WORK_DIR, "sidekiq-faults.log"),
                                           queue: "faults", database_url: @proxy.url, concurrency: 1)
    @worker.start
  end

  after(:all) do
    @worker.stop(wait: false) # the suite's worker stops beside it at the end
    @proxy.stop
  end

  # Whatever an example left: the worker running, the database back, no instruction waiting.
  after do
    ReplayHarness::EffectArrival.hook = nil
    @worker.thaw
    %i[after_effect before_completion].each { |point| ReplayPoints.resume(key, point) }
    @proxy.start unless @proxy.running?
    ReplayPoints.clear
  end

  def wait_until(what)
    Timeout.timeout(ReplayHarness::LiveQueue::TIMEOUT, RuntimeError, "timed out waiting until #{what}") do
      sleep 0.01 until yield
    end
  end

  def attempt(key)
    {{ mod }}.claims.read(key).fetch("attempt").to_i
  end

  # The error Sidekiq kept with the retry: the database could not be reached (ActiveRecord's words for it vary).
  def database_lost?(entry)
    error = "#{entry.item['error_class']}: #{entry.item['error_message']}"
    error.match?(/\AActiveRecord::\w+/) && error.match?(/connect|closed|refused|terminat/i)
  end

  it "keeps the job while the database is unreachable at the claim, and performs it once when it is back" do
    @worker.sweep # the worker now holds a connection through the proxy
    expect(@proxy.stop).to be_positive # refused from now on, and that connection cut

    jid = @worker.push(key)
    expect(@worker.wait_for(jid)).to eq("raised")
    entry = @worker.retried(jid)
    expect(database_lost?(entry)).to be(true), entry.item.inspect
    expect([effects.count, record(key)]).to eq([0, "none"])
    expect(@worker.leftovers).to eq(queued: 0, scheduled: 0, retries: 1, dead: 0)
    # Sidekiq waits (count**4) + 15 s or more before retry `count`: the job's retries outlast an hour's outage.
    budget = entry.item.fetch("retry")
    expect((0...budget).sum { |count| (count**4) + 15 }).to be >= 3600

    @proxy.start
    # The retry's time has come: the worker's one thread replaces the cut connection and the job runs once.
    connections = @proxy.accepted
    expect(@worker.retry_now(entry)).to eq("returned")
    expect(@proxy.accepted).to be > connections
    expect([effects.count, record(key)]).to eq([1, "completed"])
    expect(@worker.leftovers.values).to all(eq(0))
  end

  it "keeps a job whose record table went missing, says at ERROR what to do, and performs it once it is back" do
    table = "{{ c.record_table }}"
    connection = ActiveRecord::Base.connection
    @worker.sweep # the worker has used the table: its statements are prepared
    connection.execute("ALTER TABLE #{table} RENAME TO #{table}_away")
    begin
      jid = nil
      _, log = logged(@worker.log_path) do
        jid = @worker.push(key)
        expect(@worker.wait_for(jid)).to eq("raised")
      end
      entry = @worker.retried(jid)
    ensure
      connection.execute("ALTER TABLE #{table}_away RENAME TO #{table}")
    end

    expected = /ERROR.* {{ c.job_type }} #{key}: .*relation "#{table}" does not exist.*: run `.*migrate`/
    expect(log).to match(expected)
    expect([effects.count, record(key)]).to eq([0, "none"])
    expect(@worker.leftovers).to eq(queued: 0, scheduled: 0, retries: 1, dead: 0)
    expect(@worker.retry_now(entry)).to eq("returned")
    expect([effects.count, record(key)]).to eq([1, "completed"])
    expect(@worker.leftovers.values).to all(eq(0))
  end
{%- if kind.one_transaction %}

  # The effect is a row in the claim's transaction: losing the database before the commit loses claim and row
  # together, so the retry performs the operation once, as in case 6.
  it "loses claim and row together when the database goes before the commit; the retry performs it once" do
    ReplayPoints.halt_at(key, :after_effect, @worker.pid)
    jid = @worker.push(key)
    wait_until("the worker wrote the row") { ReplayPoints.reached?(key, :after_effect) }
    @proxy.stop
    ReplayPoints.resume(key, :after_effect)

    expect(@worker.wait_for(jid)).to eq("raised")
    entry = @worker.retried(jid)
    expect(database_lost?(entry)).to be(true), entry.item.inspect
    expect([effects.count, record(key)]).to eq([0, "none"])

    @proxy.start
    expect(@worker.retry_now(entry)).to eq("returned")
    expect([effects.count, record(key)]).to eq([1, "completed"])
    expect(@worker.leftovers.values).to all(eq(0))
  end

  # Nothing is committed before the end of the transaction, so a frozen worker leaves no claim that a lease could
  # outlive: nothing to sweep or take over, nothing for a token to refuse. Woken, it commits once.
  it "leaves nothing to take over while a worker is frozen (SIGSTOP) in its transaction; woken, it commits once" do
    ReplayPoints.halt_at(key, :after_effect, @worker.pid)
    jid = @worker.push(key)
    wait_until("the worker performed the effect") { ReplayPoints.reached?(key, :after_effect) }
    @worker.freeze
    ReplayPoints.resume(key, :after_effect) # seen once the worker wakes up
    expect([effects.count, record(key)]).to eq([0, "none"])
    expect(age_past_lease(key)).to eq(0)
    expect(sweeper.sweep).to eq(0)

    @worker.thaw
    expect(@worker.wait_for(jid)).to eq("returned")
    expect([effects.count, record(key)]).to eq([1, "completed"])
  end
  # The fourth fault, the sweeper racing a redelivery on a stale claim, cannot happen here: no claim is ever
  # committed before its completion, so none goes stale.
{%- else %}

  it "leaves the claim when the database goes at the completion; after the lease the policy applies (case 6)" do
    # The provider has the effect; before the worker hears so, its database is gone.
    ReplayHarness::EffectArrival.hook = lambda do
      ReplayHarness::EffectArrival.hook = nil
      @proxy.stop
    end
    jid = @worker.push(key)
    expect(@worker.wait_for(jid)).to eq("raised")
    entry = @worker.retried(jid)
    expect(database_lost?(entry)).to be(true), entry.item.inspect
    expect([effects.count, record(key)]).to eq([1, "claimed"])

    @proxy.start
    # Sidekiq's retry comes inside the lease: the claim is young, nothing is taken over, the job ends.
    expect(@worker.retry_now(entry)).to eq("returned")
    expect([effects.count, record(key)]).to eq([1, "claimed"])
    age_past_lease(key)
    @worker.sweep
    expect([effects.count, record(key)]).to eq([{{ policy.emails["6"] }}, "{{ policy.after_lease }}"])
    expect(@worker.leftovers.values).to all(eq(0))
  end

  it "refuses the late completion of a worker frozen (SIGSTOP) past its lease, once the policy applied" do
    ReplayPoints.halt_at(key, :after_effect, @worker.pid)
    jid = @worker.push(key)
    wait_until("the worker performed the effect") { ReplayPoints.reached?(key, :after_effect) }
    @worker.freeze
    ReplayPoints.resume(key, :after_effect) # seen once the worker wakes up
    expect([effects.count, record(key)]).to eq([1, "claimed"])
    age_past_lease(key)
{%- if takeover %}
    # The sweeper takes the claim over and waits before its own completion: the late one meets a live claim.
    ReplayPoints.halt_at(key, :before_completion, Process.pid)
    sweeping = Thread.new { sweeper.sweep }
    wait_until("the takeover reached its completion") { ReplayPoints.reached?(key, :before_completion) }
    expect([record(key), attempt(key)]).to eq(["claimed", 2])
{%- else %}
    sweeper.sweep
    expect(record(key)).to eq("{{ policy.after_lease }}")
{%- endif %}

    _, log = logged(@worker.log_path) do
      @worker.thaw
      expect(@worker.wait_for(jid)).to eq("returned")
    end
    expect(log).to include(
      "{{ c.job_type }} #{key}: not marked completed: this run no longer holds the claim"
    )
{%- if takeover %}
    expect([record(key), attempt(key)]).to eq(["claimed", 2]) # still the takeover's
    ReplayPoints.resume(key, :before_completion)
    expect(sweeping.value).to eq(1)
    expect(attempt(key)).to eq(2)
{%- endif %}
    expect([effects.count, record(key)]).to eq([{{ policy.emails["6"] }}, "{{ policy.after_lease }}"])
  end

  it "lets exactly one of the sweeper and a redelivery act on each stale claim they reach at the same moment" do
    races = Array.new(3) { |n| "#{key}-RACE-#{n + 1}" }
    job = ReplayHarness::JOB.new
    races.each do |race|
      details = {{ mod }}::Effect.details_for(race)
      {{ mod }}.claims.claim(race, job.send(:fingerprint, race, details))
      age_past_lease(race)
      ReplayPoints.meet_at_policy(race) # both wait there for the other, in two processes
    end

    (outcomes, worker_log), suite_log = logged(SUITE_LOG) do
      logged(@worker.log_path) do
        jids = races.map { |race| @worker.push(race) } # the redeliveries, in the worker
        expect(sweeper.sweep).to eq(races.size) # the sweeper, in this process
        jids.map { |jid| @worker.wait_for(jid) }
      end
    end

    log = worker_log + suite_log
    expect(outcomes).to eq(["returned"] * races.size)
    races.each do |race|
      expect(ReplayPoints.arrivals(race)).to eq(2)
{%- if takeover %}
      expect(log.scan(/ #{race}: taken over/).size).to eq(1), log
{%- else %}
      expect(log.scan(/ #{race}: {{ policy.stale_note }}/).size).to eq(1), log
{%- endif %}
      expect(log.scan(/ #{race}: skipped: another run/).size).to eq(1), log
      expect(record(race)).to eq("{{ policy.after_lease }}")
    end
    expect(effects.count).to eq({{ policy.emails["5"] }} * races.size)
    expect(@worker.leftovers.values).to all(eq(0))
  end
{%- endif %}
end
