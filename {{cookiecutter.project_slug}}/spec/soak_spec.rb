{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

# The soak's own checks (`rake {{ c.project_slug }}:soak` runs the soak itself; tests/test_soak.py of the
# template runs it against live services): a soak whose verdict could not fail would prove nothing, so
# the verdict is shown each violation it must find. In a Rails app the kit's files are the app's, autoloaded.
require_relative "soak"

RSpec.describe "the soak's checks" do
  let(:soak) { {{ mod }}::Soak }
  let(:key) { "SOAK-0000-00001" }
  let(:completed) { { "status" => "completed", "attempt" => 1, "note" => nil } }

  def violations(records, effects, log = "")
    verdict = soak::Verdict.new(records, Hash.new(0).merge(effects), log)
    records.each_key { |key| verdict.key(key) }
    yield verdict if block_given?
    verdict.violations
  end

  describe "its verdict" do
    it "passes a key completed with one effect" do
      expect(violations({ key => completed }, { key => 1 })).to eq([])
    end

    it "finds more effects than the policy allows: one, or under resend one per claim" do
      found = violations({ key => completed.merge("attempt" => 2) }, { key => 3 })
      expect(found).to contain_exactly(a_string_starting_with("#{key}: 3 effects, at most"))
    end

    it "finds a key completed with no effect" do
      expect(violations({ key => completed }, {})).to eq(["#{key}: completed with no effect"])
    end

    it "finds a key left claimed or released" do
      %w[claimed released].each do |status|
        found = violations({ key => completed.merge("status" => status) }, { key => 1 })
        expect(found).to contain_exactly(a_string_starting_with("#{key}: left #{status}"))
      end
    end

    it "finds a key with no record at all" do
      verdict = soak::Verdict.new({}, Hash.new(0), "")
      verdict.key(key)
      expect(verdict.violations).to eq(["#{key}: no record: lost, even after it was sent again"])
    end

    it "finds a key held or abandoned silently, or where the policy never puts it" do
      %w[held abandoned].each do |status|
        settled = completed.merge("status" => status, "note" => "why it was #{status}")
        logged = "WARN: {{ c.job_type }} #{key}: why it was #{status}\n"
        if soak::ENDS.include?(status)
          expect(violations({ key => settled }, { key => 1 }, logged)).to eq([])
          expect(violations({ key => settled }, { key => 1 })).to eq(["#{key}: #{status} with no log line saying why"])
          expect(violations({ key => settled.merge("note" => nil) }, {}, logged))
            .to eq(["#{key}: #{status} with no note saying why"])
        else
          expect(violations({ key => settled }, { key => 1 }, logged))
            .to contain_exactly(a_string_starting_with("#{key}: left #{status}"))
        end
      end
    end

    it "finds bad messages that had an effect, a changed conflict, jobs left in Sidekiq" do
      conflict = "SOAK-0000-conflict"
      records = { conflict => completed.merge("payload_fingerprint" => "yours") }
      found = violations(records, { "SOAK-0000-#{'X' * 10}" => 1, conflict => 1 }) do |verdict|
        verdict.bad_messages([[], [42], ["SOAK-0000-#{'X' * 10}"], [conflict]], conflict)
        verdict.leftovers("queue" => 0, "dead set" => 1)
      end
      expect(found).to include(
        a_string_matching(/a bad message had 1 effect/),
        a_string_starting_with("#{conflict}: the conflicting message changed the record"),
        "1 job(s) of the soak left in Sidekiq's dead set"
      )
    end
  end

  # The soak's workers only (spec/soak_worker.rb): the worker dies by SIGKILL right after taking a message, before
  # the job runs, while the soak's chaos runs; never otherwise.
  describe "its kill right after a take" do
    let(:switch) { File.join(WORK_DIR, "chaos") }
    let(:message) { { "jid" => "0123", "args" => [key] } }

    # How a process that takes the message through the middleware ends: its exit status.
    def take(share)
      # the child uses no database: no open connection to inherit (sqlite3 2 warns of one in a forked child)
      ActiveRecord::Base.connection_pool.disconnect!
      pid = fork do
        $stderr.reopen(File::NULL) # the worker's line saying so goes to the soak's log, not here
        soak::KillAfterTake.new(share, switch).call(nil, message, "default") { exit!(0) }
        exit!(1)
      end
      Process.wait2(pid).last
    end

    after { FileUtils.rm_f(switch) }

    it "kills the worker before the job runs, while the chaos runs" do
      FileUtils.touch(switch)
      expect(take(1.0).termsig).to eq(9)
    end

    it "runs the job when the chaos has stopped, or for the messages it spares" do
      expect(take(1.0).exitstatus).to eq(0)
      FileUtils.touch(switch)
      expect(take(0.0).exitstatus).to eq(0)
    end
  end

  describe "its plan of sends" do
    it "sends every key once, a share of them two or three times, some copies right behind the first" do
      settings = Struct.new(:operations, :duplicates, :seed).new(1000, 0.3, 7)
      plan = soak::Planner.new("SOAK-0000-", settings).plan
      copies = plan.tally

      expect(copies.size).to eq(1000)
      expect(copies.values.uniq.sort).to eq([1, 2, 3])
      expect(copies.count { |_, n| n > 1 }).to be_within(60).of(300)
      expect(plan.each_cons(2).count { |first, second| first == second }).to be > 50
    end
  end

  describe "its settings" do
    let(:services) { { "DATABASE_URL" => "postgresql://localhost/x", "REDIS_URL" => "redis://localhost/1" } }

    if HOST_APP
      it "refuses to run inside a Rails app, in one line" do
        expect { soak::Settings.new(services) }.to raise_error(soak::BadInput, /not inside a Rails app/)
      end
    else
      it "takes rake's way of giving them, with the defaults of the issue" do
        settings = soak::Settings.new(services.merge("OPERATIONS" => "300", "KILL_EVERY" => "1"))
        expect([settings.operations, settings.workers, settings.kill_every, settings.duplicates])
          .to eq([300, 4, 1.0, 0.3])
        expect(settings.kill_after_take).to eq(0.005)
        expect(soak::Settings.new(services.merge("KILL_AFTER_TAKE" => "0.02")).kill_after_take).to eq(0.02)
      end

      it "refuses a bad setting, SQLite or no Redis with one line" do
        {
          { "OPERATIONS" => "0" } => "OPERATIONS=0 is not a whole number of at least 1 (e.g. OPERATIONS=2000)",
          { "WORKERS" => "two" } => "WORKERS=two is not a whole number of at least 1 (e.g. WORKERS=4)",
          { "KILL_EVERY" => "0" } => "KILL_EVERY=0 is not a number above 0 (e.g. KILL_EVERY=3.0)",
          { "DUPLICATES" => "1.5" } => "DUPLICATES=1.5 is not a number at least 0, at most 1 (e.g. DUPLICATES=0.3)",
          { "KILL_AFTER_TAKE" => "0.6" } =>
            "KILL_AFTER_TAKE=0.6 is not a number at least 0, at most 0.5 (e.g. KILL_AFTER_TAKE=0.005)",
          { "DATABASE_URL" => "sqlite3:db/x.sqlite3" } => /\ADATABASE_URL must be a PostgreSQL URL/,
          { "REDIS_URL" => "" } => /\AREDIS_URL is missing/
        }.each do |given, line|
          expect { soak::Settings.new(services.merge(given)) }.to raise_error(soak::BadInput, line)
        end
      end
    end
  end
end
