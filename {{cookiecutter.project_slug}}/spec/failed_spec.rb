{%- from "replay_matrix.jinja" import rb, kind, states with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

require "json"
require "securerandom"
require "timeout"

# No operation ends where no command shows it: an effect that fails past Sidekiq's retries ends failed, the
# person's list shows it beside the held ones and a person sends it again; the status task reads every state
# and fails while something waits for a person or sits past its time.
RSpec.describe "failed operations and the status of {{ c.job_type }}" do
  let(:kit) { {{ mod }} }
  let(:job_class) { ReplayHarness::JOB }
  let(:key) { {{ rb(c.example_key) }} }

  after { ReplayPoints.clear }

  def eventually(what, seconds = 20)
    Timeout.timeout(seconds, RuntimeError, "timed out waiting until #{what}") { sleep 0.05 until yield }
  end

  # A record in `status` written directly, its claimed_at `age` seconds back on the database's clock.
  def record_in(key, status, age: 0)
    postgresql = ActiveRecord::Base.connection.adapter_name == "PostgreSQL"
    at = postgresql ? "clock_timestamp() - make_interval(secs => #{age})" : "julianday('now') - #{age} / 86400.0"
    done = status == "completed" ? at : "NULL"
    ActiveRecord::Base.connection.execute(<<~SQL)
      INSERT INTO {{ c.record_table }} (job_type, operation_key, payload_fingerprint, status, claim_token, attempt, claimed_at, completed_at)
      VALUES ('{{ c.job_type }}', #{ActiveRecord::Base.connection.quote(key)}, 'f', '#{status}', '#{SecureRandom.hex(8)}', 1, #{at}, #{done})
    SQL
  end

  # The effect fails on every attempt until Sidekiq gives up. Live: a message with one retry, run by the worker,
  # retried at once from Sidekiq's retry set, and given up by Sidekiq itself. Embedded (no retries there): the
  # job raises, then Sidekiq's hook for a job past its retries is called as Sidekiq calls it.
  def fail_past_retries(key)
{%- if kind.one_transaction %}
    # Sent by enqueue (its message left out: the spec sends it): here the effect's error rolls each claim back with
    # its transaction, and only a record from the send is left, queued, to become failed.
    details = kit::Effect.details_for(key)
    kit.claims.enqueue(key, job_class.new.send(:fingerprint, key, details), JSON.generate(details))
{%- endif %}
    ReplayPoints.fail_effect(key)
    LIVE ? fail_in_the_worker(key) : fail_in_this_process(key)
  ensure
    ReplayPoints.clear
  end

  def fail_in_the_worker(key)
    jid = Sidekiq::Client.push("class" => job_class.name, "args" => [key], "queue" => "default", "retry" => 1)
    expect(queue.finish(jid)).to eq("raised")
    expect(queue.retry_now(queue.retried(jid))).to eq("raised")
    eventually("Sidekiq gave up and the record is failed") { record(key) == "failed" }
  end

  def fail_in_this_process(key)
    error = begin
      job_class.new.perform(key)
    rescue IOError => e
      e
    end
    expect(record(key)).to eq("{{ "queued" if kind.one_transaction else "released" }}")
    job_class.sidekiq_retries_exhausted_block.call({ "class" => job_class.name, "args" => [key] }, error)
  end

  it "ends failed with the last error once Sidekiq gives up on a failing effect" do
    fail_past_retries(key)

    row = ActiveRecord::Base.connection.select_one("SELECT status, note FROM {{ c.record_table }}")
    expect(row["status"]).to eq("failed")
    expect(row["note"]).to match(/failed past Sidekiq's retries: IOError: the provider refused/)
    expect(effects.count).to eq(0)
  end

  it "lists the failed operation beside the held ones, and a person sends it again: performed once" do
    fail_past_retries(key)
    listing = StringIO.new

    expect(kit::HeldOperations.list(listing).map(&:key)).to eq([key])
    expect(listing.string.lines.first).to include(key, "\tfailed\t", "IOError")
    expect(listing.string.lines.last).to eq("0 held, 1 failed\n")

    jid = kit::HeldOperations.resolve(key, done: false, by: "alice", why: "the provider is back")
    expect(record(key)).to eq("queued").or eq("claimed").or eq("completed") # live, the worker may be at it
    queue.finish(jid)

    expect(effects.count).to eq(1)
    expect(record(key)).to eq("completed")
    expect(kit::HeldOperations.list(StringIO.new)).to be_empty
  end

  it "marks a failed operation done when a person says the effect happened" do
    record_in(key, "failed")

    kit::HeldOperations.resolve(key, done: true, by: "bob", why: "sent by hand")

    expect(record(key)).to eq("completed")
    expect(effects.count).to eq(0)
  end

  # Left out inside a host app (REPLAY_HOST_APP), which runs its own rake.
  describe "the status task", unless: HOST_APP do
    # `rake {{ c.project_slug }}:status` as a monitor runs it: its output and exit status. The task of the
    # kit's Rakefile, run in this process (its `rake` process is run by the retention examples and the README's).
    def status
      task = status_task
      task.reenable
      out = StringIO.new
      err = StringIO.new
      streams = [$stdout, $stderr]
      code = begin
        $stdout = out
        $stderr = err
        task.invoke
        0
      rescue SystemExit => e
        e.status
      ensure
        $stdout, $stderr = streams
      end
      expect(err.string).to eq("")
      [out.string, code]
    end

    def status_task
      name = "{{ c.project_slug }}:status"
      require "rake"
      Rake.load_rakefile(File.join(__dir__, "..", "Rakefile")) unless Rake::Task.task_defined?(name)
      Rake::Task[name]
    end

    it "prints every state in order and exits 0 when every operation is completed" do
      record_in("DONE-1", "completed", age: 30)
      record_in("DONE-2", "completed", age: 5)

      out, code = status

      expect(code).to eq(0)
      states = %w[{{ states|join(" ") }}]
      expect(out.lines.map { |line| line.split.first }).to eq(states + ["ok:"])
      expect(out.lines[{{ (states|list).index("completed") }}]).to match(/\Acompleted {8}2  3\ds\n\z/)
      expect(out.lines[0]).to eq("queued           0  -\n")
      expect(out.lines.last).to eq("ok: nothing waits for a person or sits past its time\n")
    end

    it "exits 1 on a queued operation past the re-send time, not on a young one" do
      record_in("YOUNG", "queued")
      expect(status.last).to eq(0)

      record_in("LOST", "queued", age: kit::LEASE_SECONDS + 1)
      out, code = status

      expect(code).to eq(1)
      expect(out.lines.first).to match(/\Aqueued {11}2  \d+s\n\z/)
      expect(out.lines.first[/(\d+)s$/, 1].to_i).to be > kit::LEASE_SECONDS
      expect(out.lines.last).to eq("attention: 1 queued past #{kit::LEASE_SECONDS} s\n")
    end

    it "exits 1 on held and failed operations, and on claims past the lease" do
      record_in("HELD", "held")
      record_in("FAILED", "failed")
      record_in("STUCK", "claimed", age: kit::LEASE_SECONDS + 1)

      out, code = status

      expect(code).to eq(1)
      expect(out.lines.last).to eq("attention: 1 held, 1 failed, 1 claimed past #{kit::LEASE_SECONDS} s\n")
    end
  end
end
