{%- from "replay_matrix.jinja" import policy, kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
{%- set ends = ["completed"] if kind.one_transaction or policy.after_lease == "completed" else ["completed", policy.after_lease] -%}
{%- set sink = {"external_no_reference": ["SmtpSink", "smtp_sink", "the SMTP sink"],
                "external_with_reference": ["ReferenceProvider", "reference_provider", "the fake provider"]}.get(c.effect_kind) -%}
# frozen_string_literal: true

require "fileutils"
require "json"
require "rbconfig"
require "securerandom"
require "set"
require "socket"
require "tmpdir"

module {{ mod }}
  # The soak, from the kit's folder (not inside a Rails app):
  #
  #   bundle exec rake {{ c.project_slug }}:soak
  #
  # OPERATIONS keys, each sent through the kit's producer (its record, queued, then its message), a share
  # DUPLICATES of them sent again once or twice as a redelivery would (some copies at the same moment), through
  # Redis to WORKERS real worker processes (the command a user runs, plus KillAfterTake) while a chaos loop kills
  # one with kill -9 every KILL_EVERY seconds (jittered) and starts it again, a worker kills itself right after
  # taking a share KILL_AFTER_TAKE of its messages, and half-way every connection to the database is ended, as a
  # restart of the server ends them; plus a few bad messages. Then every key is settled
  # as in production (claims aged past the lease in SQL, records still queued aged past the re-send time, the
  # sweeper) and the policy is checked key by key where
  # the effects arrived (policy {{ c.stale_claim_policy }}; {{ kind.counted }}).
  # It prints a table, writes replay-soak.json and renders the replay reports again when replay-report.json is
  # there. Exit status 0 when every invariant held, 1 on any violation, 2 on bad input.
  class Soak
    # A setting, or an environment, that the soak cannot run with: one line, exit status 2.
    class BadInput < StandardError; end

    # The run could not go on (a worker that exits by itself, a queue that stops draining): exit status 1.
    class Stopped < StandardError; end

    ROOT = File.expand_path("..", __dir__)
    QUEUE = "default"
    # The worker as the README runs it, `sidekiq -r ./lib/{{ c.project_slug }}.rb -q default`, through a file
    # that loads the kit and adds KillAfterTake (below), and only that.
    WORKER = ["-r", "./spec/soak_worker.rb", "-q", QUEUE].freeze
    # How a key may end under this kit's answers; any other status (claimed, released) is a violation.
    ENDS = %w[{{ ends|join(" ") }}].freeze
    # How long the queue may keep the same size, or the workers take to start, before the soak gives up.
    STALL_SECONDS = 60
    # How long a worker asked to stop may take: Sidekiq's own shutdown timeout (25 s) and a margin.
    STOP_SECONDS = 30
    # The messages go in slices of SLICE, spread over SPREAD kill intervals at least (the workers that kill
    # themselves after a take spend some of them starting again).
    SLICE = 50
    SPREAD = 5

    # OPERATIONS=2000 WORKERS=4 KILL_EVERY=3 DUPLICATES=0.3 KILL_AFTER_TAKE=0.005 SEED=<n>, rake's way, from an
    # environment the soak can run in. Raises BadInput.
    class Settings
      attr_reader :operations, :workers, :kill_every, :duplicates, :kill_after_take, :seed

      def initialize(env)
        where(env)
        @operations = whole(env, "OPERATIONS", 2000)
        @workers = whole(env, "WORKERS", 4)
        @kill_every = number(env, "KILL_EVERY", 3.0)
        @duplicates = number(env, "DUPLICATES", 0.3, least: 0, most: 1)
        @kill_after_take = number(env, "KILL_AFTER_TAKE", 0.005, least: 0, most: 0.5)
        @seed = env.key?("SEED") ? whole(env, "SEED", 0, least: 0) : Random.new_seed % (2**31)
      end

      private

      def where(env)
        if defined?(Rails.application) && Rails.application
          raise BadInput, "the soak runs from the kit's own folder " \
                          "(bundle exec rake {{ c.project_slug }}:soak), " \
                          "not inside a Rails app: it starts the kit's own worker command"
        end
        unless env.fetch("DATABASE_URL", "").match?(%r{\Apostgres(ql)?://})
          raise BadInput, "DATABASE_URL must be a PostgreSQL URL (postgresql://...): the soak runs against live " \
                          "services, several worker processes writing at once"
        end
        return unless env["REDIS_URL"].to_s.empty?

        raise BadInput, "REDIS_URL is missing: give the Redis the workers use (redis://...)"
      end

      def whole(env, name, default, least: 1)
        text = env.fetch(name, default.to_s)
        value = Integer(text, 10, exception: false)
        return value if value && value >= least

        raise BadInput, "#{name}=#{text} is not a whole number of at least #{least} (e.g. #{name}=#{default})"
      end

      # A number above 0 (or from `least`), at most `most`.
      def number(env, name, default, least: nil, most: Float::INFINITY)
        text = env.fetch(name, default.to_s)
        value = Float(text, exception: false)
        return value if value&.between?(least || Float::MIN, most)

        bounds = [least ? "at least #{least}" : "above 0", ("at most #{most}" if most.finite?)].compact.join(", ")
        raise BadInput, "#{name}=#{text} is not a number #{bounds} (e.g. #{name}=#{default})"
      end
    end

    # Runs the soak; the exit status.
    def self.run(env = ENV, out = $stdout)
      new(Settings.new(env), out).run
    rescue BadInput => e
      warn "soak: #{e.message}"
      2
    end

    def initialize(settings, out)
      @settings = settings
      @out = out
      @prefix = "SOAK-#{SecureRandom.hex(4)}-"
      @records = Records.new(@prefix)
      @dir = Dir.mktmpdir("soak-")
      @log = File.join(@dir, "soak.log")
      @jids = Set.new
      @sent = Hash.new(0)
      @figures = Hash.new(0)
    end

    def run
      prepare
      clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      Chaos.new(@workers, @settings).during do
        send_all
        wait_until_queue_empty
      end
      drain
      settle
      @figures["seconds"] = (Process.clock_gettime(Process::CLOCK_MONOTONIC) - clock).round(1)
      finish(check)
    rescue BadInput
      FileUtils.rm_rf(@dir)
      raise
    rescue Stopped => e
      @out.puts "soak stopped: #{e.message}; the log of the workers and the sweeper is #{@log}"
      1
    ensure
      @workers&.stop
      @receiver&.stop
    end

    private

    # The table, an empty queue and the receiver; then WORKERS workers, started and fetching.
    def prepare
      require "sidekiq/api"
      @started_at = Outcome.now
      # The kit logs every skip, hold and takeover: into the log, with the workers', not onto the table.
      Sidekiq.logger.reopen(@log)
      # Sidekiq 6.4 on redis-rb 4.8 warns on every push; the answer it warns about is not used.
      Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)
      ActiveRecord::Migration.verbose = false
      {{ mod }}.migrate!
      alone
      @receiver = Receiver.new(@prefix).start
      # The sweeper runs in this process, and performs the effect again under resend and lookup.
      @receiver.env.each { |name, value| ENV[name] = value }
      kills = { "SOAK_KILL_AFTER_TAKE" => @settings.kill_after_take.to_s, "SOAK_CHAOS" => File.join(@dir, "chaos") }
      @workers = Workers.new(@settings.workers, ENV.to_h.merge(kills), @log)
      @workers.start
      @workers.wait_until_fetching
    end

    # The queue empty, and no Sidekiq process fetching from it but the soak's own.
    def alone
      waiting = queue_size
      raise BadInput, "the queue #{QUEUE} holds #{waiting} job(s): the soak needs it empty" if waiting.positive?
      return if (others = Workers.running).empty?

      raise BadInput, "Sidekiq is running on this Redis (#{others.join(', ')}): stop it; the soak needs the queue " \
                      "to itself and starts its own workers"
    end

    # The plan in slices of SLICE messages, spread over SPREAD kill intervals at least: however fast the machine,
    # kills land while work is in flight. Half-way, the database restarts as the workers see it.
    def send_all
      plan = Planner.new(@prefix, @settings).plan
      @figures["messages"] = plan.size
      @figures["duplicates"] = plan.size - @settings.operations
      slices = plan.each_slice(SLICE).to_a
      pause = SPREAD * @settings.kill_every / slices.size
      slices.each_with_index do |keys, index|
        keys.each { |key| send_one(key) }
        restart_database if index == slices.size / 2
        @workers.check
        sleep pause
      end
      send_bad_messages
    end

    # Every connection to the database ended, as a restart of the server ends them, once every worker is up (each
    # holds connections by then).
    def restart_database
      @figures["connections_ended"] = @workers.once_fetching { @records.restart_database }
    end

    def send_bad_messages
      @bad = BadMessages.new(@prefix)
      @jids.merge(@bad.send_all { |args| push(args) })
      @figures["bad_messages"] = @bad.size
    end

    # A key's first message goes as the app sends it, through the producer: its record (queued), then the
    # message. Its copies go as a redelivery brings them: the same message again.
    def send_one(key)
      jid = if @sent[key].zero?
              {{ job }}.enqueue(key)
            else
              push([key, JSON.parse(JSON.generate(Effect.details_for(key)))])
            end
      @jids << jid if jid
      @sent[key] += 1
    end

    def push(args)
      Sidekiq::Client.push("class" => {{ job }}.name, "queue" => QUEUE, "args" => args)
    end

    # Runs the workers until Redis holds no job of the run, then stops them: a worker asked to stop (TERM)
    # finishes the jobs it holds, and Sidekiq puts back any it cannot finish in time.
    def drain
      loop do
        @workers.start
        wait_until_queue_empty
        @workers.stop
        break if queue_size.zero?
      end
      @figures["workers_killed"] = @workers.killed
      @figures["killed_after_take"] = @workers.killed_after_take
      @figures["stuck"] = @workers.stuck.size
    end

    def wait_until_queue_empty
      last = [queue_size, Process.clock_gettime(Process::CLOCK_MONOTONIC)]
      until (size = queue_size).zero?
        @workers.check
        moment = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        last = [size, moment] if size != last.first
        raise Stopped, "#{size} job(s) stayed in the queue for #{STALL_SECONDS} s" if moment - last.last > STALL_SECONDS

        sleep 0.1
      end
    end

    # Every key to its end: retries brought forward; keys that the queue lost before their claim (still queued)
    # aged past the re-send time in SQL and sent again by the kit's sweeper; the claims of dead workers aged past
    # the lease in SQL and swept.
    def settle
      3.times do
        again = retry_now + resend_lost
        drain if again.positive?
        # Every worker is stopped: a claim still `claimed` is a dead worker's.
        @records.age
        sweep
        break if queue_size.zero?
      end
    end

    # Jobs of the run waiting in the retry set (an effect that raised) go to the queue now, not minutes later.
    def retry_now
      waiting = Sidekiq::RetrySet.new.select { |entry| mine?(entry) }
      waiting.each(&:retry)
      @figures["retried_now"] += waiting.size
      waiting.size
    end

    # Keys still queued once the queue is empty: every copy was lost by the queue before a claim (kill -9 on a
    # worker that had fetched it, which open-source Sidekiq does not redeliver)
{%- if kind.one_transaction %}, or a death rolled the claim back{% endif %}.
    # Their records aged past the re-send time in SQL, the kit's sweeper sends them again, as it would once that
    # time had passed.
    def resend_lost
      @records.age_queued
      sent = StaleClaimSweeperJob.resend_queued
      @figures["lost_resent"] += sent
      sent
    end

    # A job of this run: pushed by it, or sent again by the sweeper for one of its keys.
    def mine?(job)
      @jids.include?(job.jid) || job.args.first.to_s.start_with?(@prefix)
    end

    # The kit's sweeper, until nothing is stale.
    def sweep = 1000.times { break if StaleClaimSweeperJob.sweep.zero? }

    def queue_size = Sidekiq::Queue.new(QUEUE).size

    # The violations, and the figures counted on the way.
    def check
      effects, @figures["foreign"] = @receiver.effects
      log = File.read(@log)
      verdict = Verdict.new(@records.all, effects, log)
      @sent.each_key { |key| verdict.key(key) }
      verdict.bad_messages(@bad.all, @bad.conflict)
      verdict.leftovers(leftovers)
      @figures["effects"] = @sent.keys.sum { |key| effects[key] }
      %w[completed held abandoned].each { |status| @figures[status] = verdict.ends[status] }
      @figures["refused"] = log.scan("#{JOB_TYPE} refused").size
      @figures["buried"] = @bad.buried
      verdict.violations
    end

    # Jobs of the run that Sidekiq still holds, by where (a refused bad message belongs in the dead set).
    def leftovers
      sets = { "queue" => Sidekiq::Queue.new(QUEUE), "retry set" => Sidekiq::RetrySet.new,
               "scheduled set" => Sidekiq::ScheduledSet.new, "dead set" => Sidekiq::DeadSet.new }
      sets.transform_values { |set| set.count { |job| mine?(job) && !@bad.buried?(job) } }
    end

    def finish(violations)
      outcome = Outcome.new(@settings, @figures, violations, started_at: @started_at, receiver: @receiver.describe)
      outcome.print(@out)
      outcome.write(@out)
      tidy(violations.empty?)
      violations.empty? ? 0 : 1
    end

    # A run that passed leaves nothing behind; one that did not keeps its records, effects and log to look at.
    def tidy(passed)
      unless passed
        @out.puts "kept for a look: the records #{@prefix}* in #{RECORD_TABLE} and the log of the workers and " \
                  "the sweeper, #{@log}"
        return
      end

      {{ mod }}.with_connection { |connection| @receiver.forget(connection) }
      @records.delete
      Sidekiq::DeadSet.new.each { |job| job.delete if @bad.buried?(job) }
      return FileUtils.rm_rf(@dir) if @figures["stuck"].zero?

      @out.puts "kept for a look: the log of the workers and the sweeper, #{@log}"
    end

    # Messages that can never succeed, and a key already recorded with another payload (a conflict): each is
    # refused with an error in the log and put in Sidekiq's dead set with its reason, never retried.
    class BadMessages
      attr_reader :all, :conflict

      def initialize(prefix)
        @conflict = "#{prefix}conflict"
        too_long = "#{prefix}#{'X' * {{ mod }}::MAX_KEY_LENGTH}"
        @all = [[], [42], [too_long], ["#{prefix}NUL\u0000"], [@conflict]]
      end

      def size = @all.size

      # Records the conflicting key with another payload, then pushes each (the block does); their jids.
      def send_all(&)
        claims = {{ mod }}.claims
        claims.complete(claims.claim(@conflict, "another payload, recorded before the soak"))
        @jids = @all.map(&)
      end

      # How many the dead set holds, with their reason.
      def buried
        Sidekiq::DeadSet.new.count { |job| buried?(job) }
      end

      # A bad message of the run that the job refused into the dead set, with its reason: where it belongs.
      def buried?(job)
        @jids.include?(job.jid) && job["error_class"].to_s.end_with?("BadMessage", "PayloadConflict")
      end
    end

    # The run's records in the record table.
    class Records
      def initialize(prefix)
        @keys = "#{prefix}%"
      end

      # By key: status, attempt, note, payload_fingerprint.
      def all
        sql(:exec_query, <<~SQL).to_a.to_h { |row| [row["operation_key"], row] }
          SELECT operation_key, status, attempt, note, payload_fingerprint FROM #{RECORD_TABLE}
          WHERE job_type = ? AND operation_key LIKE ?
        SQL
      end

      # The claims aged past the lease in SQL, on the database's clock, as the replay suite does.
      def age
        sql(:exec_update, <<~SQL, LEASE_SECONDS + 1)
          UPDATE #{RECORD_TABLE} SET claimed_at = claimed_at - make_interval(secs => ?)
          WHERE job_type = ? AND operation_key LIKE ? AND status = 'claimed'
        SQL
      end

      # The records still queued, aged past the re-send time in SQL: the sweeper sends their messages again.
      def age_queued
        sql(:exec_update, <<~SQL, {{ mod }}.resend_queued_after + 1)
          UPDATE #{RECORD_TABLE} SET claimed_at = claimed_at - make_interval(secs => ?)
          WHERE job_type = ? AND operation_key LIKE ? AND status = 'queued'
        SQL
      end

      def delete
        sql(:exec_delete, "DELETE FROM #{RECORD_TABLE} WHERE job_type = ? AND operation_key LIKE ?")
      end

      # Ends every other connection to the soak's database, as a restart of the server ends them (the workers'
      # among them: their next statement finds the connection gone); how many.
      def restart_database
        {{ mod }}.with_connection do |connection|
          connection.select_value(<<~SQL).to_i
            SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid()
          SQL
        end
      end

      private

      def sql(method, text, *binds)
        {{ mod }}.with_connection do |connection|
          connection.public_send(method, ActiveRecord::Base.sanitize_sql_array([text, *binds, JOB_TYPE, @keys]))
        end
      end
    end

    # The order in which the keys are sent.
    class Planner
      def initialize(prefix, settings)
        @prefix = prefix
        @settings = settings
        @random = Random.new(settings.seed)
      end

      def keys
        width = [5, @settings.operations.to_s.size].max
        Array.new(@settings.operations) { |n| format("%<prefix>s%<n>0#{width}d", prefix: @prefix, n: n + 1) }
      end

      # Each key once, in order; a share of them once or twice more, each extra copy either right behind the
      # first (two workers take them at the same moment) or somewhere later.
      def plan
        plan = []
        later = []
        keys.each do |key|
          plan << key
          next unless @random.rand < @settings.duplicates

          @random.rand(1..2).times { @random.rand < 0.5 ? plan << key : later << [plan.size, key] }
        end
        later.each { |after, key| plan.insert(@random.rand(after..plan.size), key) }
        plan
      end
    end

    # WORKERS processes of the kit's own worker command, each started again after a kill.
    class Workers
      attr_reader :killed, :killed_after_take, :stuck

      def self.host
        ENV["DYNO"] || Socket.gethostname
      end

      # Sidekiq processes registered on this Redis, as host:pid, but for the dead ones of this machine (a killed
      # worker stays registered for a minute).
      def self.running
        Sidekiq::ProcessSet.new.filter_map do |process|
          pid = process["pid"]
          next if process["hostname"] == host && !alive?(pid)

          "#{process['hostname']}:#{pid}"
        end
      end

      def self.alive?(pid)
        Process.kill(0, pid)
        true
      rescue Errno::ESRCH
        false
      rescue Errno::EPERM
        true
      end

      def initialize(count, env, log)
        @count = count
        @env = env
        @log = log
        @pids = []
        @killed = 0
        @killed_after_take = 0
        @stuck = []
        @lock = Mutex.new
      end

      # While the block runs, each worker kills itself right after taking a share KILL_AFTER_TAKE of its messages
      # (KillAfterTake): the file SOAK_CHAOS says so to them.
      def killing_after_takes
        FileUtils.touch(@env.fetch("SOAK_CHAOS"))
        yield
      ensure
        FileUtils.rm_f(@env.fetch("SOAK_CHAOS"))
      end

      def start
        @lock.synchronize { (@count - @pids.size).times { @pids << spawn } }
      end

      # Until every worker has registered with Sidekiq: it is fetching jobs.
      def wait_until_fetching
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + STALL_SECONDS
        until (@pids - fetching).empty?
          check
          late = Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          raise Stopped, "the workers did not start in #{STALL_SECONDS} s" if late

          sleep 0.1
        end
      end

      # The block's count once every worker fetches, asked again until it is positive or STALL_SECONDS pass: a kill
      # may land in between and leave only a worker that has not connected yet.
      def once_fetching
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + STALL_SECONDS
        loop do
          wait_until_fetching
          count = yield
          return count if count.positive? || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

          sleep 0.2
        end
      end

      # kill -9 on a worker that is fetching jobs, chosen at random, and a new one in its place; nil while none
      # is fetching.
      def kill_one(random)
        @lock.synchronize do
          replace_exited # a worker that killed itself may still show as fetching for a while
          ready = @pids & fetching
          next if ready.empty?

          pid = ready.sample(random: random)
          Process.kill(:KILL, pid)
          Process.wait(pid)
          @pids[@pids.index(pid)] = spawn
          @killed += 1
        end
      end

      # A worker that killed itself right after a take (SIGKILL) is counted and replaced. Raises Stopped when one
      # exited otherwise (it could not start, say).
      def check
        @lock.synchronize { replace_exited }
      end

      def all_fetching?
        @lock.synchronize do
          replace_exited
          (@pids - fetching).empty?
        end
      end

      # TERM: each worker finishes the jobs it holds and exits (Sidekiq gives them 25 s, then puts them back). One
      # still there after STOP_SECONDS is stuck: its threads go to the log (TTIN), then kill -9.
      def stop
        @lock.synchronize do
          @pids.each { |pid| Process.kill(:TERM, pid) }
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + STOP_SECONDS
          @pids.reject { |pid| exited?(pid, deadline) }.each { |pid| kill_stuck(pid) }
          @pids.clear
        end
      end

      private

      def replace_exited
        @pids.each_with_index do |pid, index|
          _, status = Process.wait2(pid, Process::WNOHANG)
          next unless status

          @pids.delete(pid)
          raise Stopped, "the worker #{pid} exited by itself (#{status})" unless status.termsig == 9

          @killed_after_take += 1
          @pids.insert(index, spawn)
        end
      end

      # A worker asked to stop may have killed itself right after a take just before: counted.
      def exited?(pid, deadline)
        until (status = Process.wait2(pid, Process::WNOHANG)&.last)
          return false if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

          sleep 0.1
        end
        @killed_after_take += 1 if status.termsig == 9
        true
      end

      def kill_stuck(pid)
        Process.kill(:TTIN, pid)
        sleep 1
        Process.kill(:KILL, pid)
        Process.wait(pid)
        @stuck << pid
      end

      def spawn
        Process.spawn(@env, RbConfig.ruby, Gem.bin_path("sidekiq", "sidekiq"), *WORKER,
                      chdir: ROOT, out: [@log, "a"], err: [@log, "a"])
      end

      # The pids of this machine's Sidekiq processes that have registered (they fetch jobs).
      def fetching
        host = Workers.host
        Sidekiq::ProcessSet.new.select { |process| process["hostname"] == host }.map { |process| process["pid"] }
      end
    end

    # Kills a random worker every KILL_EVERY seconds, jittered, while the block runs, and lets workers kill
    # themselves right after a take.
    class Chaos
      def initialize(workers, settings)
        @workers = workers
        @every = settings.kill_every
        @random = Random.new(settings.seed + 1)
        @lock = Mutex.new
        @stopping = ConditionVariable.new
        @stop = false
      end

      def during(&)
        thread = Thread.new { kill_until_stopped }
        @workers.killing_after_takes(&)
      ensure
        @lock.synchronize do
          @stop = true
          @stopping.signal
        end
        thread&.join
      end

      private

      # Each interval counts from the moment every worker is fetching again, so that a worker always works for
      # one between two kills of the loop, whatever the kills right after a take do meanwhile.
      def kill_until_stopped
        until @stop
          pause(@every * @random.rand(0.5..1.5))
          pause(0.2) until @stop || @workers.kill_one(@random) # none is fetching: all are starting
          pause(0.2) until @stop || @workers.all_fetching?
        end
      end

      def pause(seconds)
        @lock.synchronize { @stopping.wait(@lock, seconds) unless @stop }
      end
    end

    # The kill a random one seldom meets: a server middleware, first in the soak's workers only
    # (spec/soak_worker.rb), that SIGKILLs its own process right after the worker took a message, before anything
    # else runs it, for a share of the messages taken while the soak's chaos runs. Open-source Sidekiq has taken
    # the message out of Redis by then: it is lost, as when a kill lands at that moment by chance.
    class KillAfterTake
      def initialize(share, switch)
        @share = share
        @switch = switch
      end

      def call(_job, message, _queue)
        if @share.positive? && rand < @share && File.exist?(@switch)
          warn "soak: worker #{Process.pid} kills itself right after taking #{message['jid']} " \
               "(#{message['args'].first.to_s[0, 40]})"
          Process.kill(:KILL, Process.pid)
          sleep # until the signal lands
        end
        yield
      end
    end

    # The invariants, key by key, from the records and the effects counted where they arrived.
    class Verdict
      attr_reader :violations, :ends

      def initialize(records, effects, log)
        @records = records
        @effects = effects
        @log = log
        @violations = []
        @ends = Hash.new(0)
      end

      def key(key)
        record = @records[key]
        return @violations << "#{key}: no record: lost, even after it was sent again" unless record

        @ends[record["status"]] += 1
        status_problem(key, record)
        effect_problem(key, record, @effects[key])
      end

      # Refused before any claim or effect; the conflicting key's record as it was.
      def bad_messages(bad, conflict)
        bad.map(&:first).grep(String).each do |key|
          effects = @effects[key]
          @violations << "#{key[0, 40]}...: a bad message had #{effects} effect(s)" if effects.positive?
        end
        record = @records[conflict]
        return if record && record["status"] == "completed" && record["payload_fingerprint"].start_with?("another")

        @violations << "#{conflict}: the conflicting message changed the record: #{record.inspect}"
      end

      def leftovers(left)
        left.select { |_, count| count.positive? }.each do |where, count|
          @violations << "#{count} job(s) of the soak left in Sidekiq's #{where}"
        end
      end

      private

      def status_problem(key, record)
        status = record["status"]
        return @violations << "#{key}: left #{status}, not one of #{ENDS.join(', ')}" unless ENDS.include?(status)
        return if status == "completed"
        return @violations << "#{key}: #{status} with no note saying why" if record["note"].to_s.empty?
        return if @log.include?("#{JOB_TYPE} #{key}: #{record['note']}")

        @violations << "#{key}: #{status} with no log line saying why"
      end

      def effect_problem(key, record, effects)
{%- if c.stale_claim_policy == "resend" and not kind.one_transaction %}
        # One effect per claim: a second only where the claim was taken over after a death.
        most = record["attempt"].to_i
{%- else %}
        most = 1
{%- endif %}
        if effects > most
          @violations << "#{key}: #{effects} effects, at most #{most} under #{STALE_CLAIM_POLICY}"
        elsif record["status"] == "completed" && effects.zero?
          @violations << "#{key}: completed with no effect"
        end
      end
    end

    # The figures: printed as a table, written to replay-soak.json, shown in the replay reports.
    class Outcome
      ROWS = {
        "operations" => "keys", "messages" => "messages sent", "duplicates" => "duplicates sent",
        "bad_messages" => "bad messages", "workers_killed" => "workers killed",
        "killed_after_take" => "killed right after a take", "effects" => "effects",
        "completed" => "completed", "held" => "held", "abandoned" => "abandoned",
        "lost_resent" => "lost by the queue, sent again", "violations" => "violations", "seconds" => "seconds",
        "throughput" => "throughput (operations/s)"
      }.freeze

      def self.now
        Time.now.utc.strftime("%Y-%m-%dT%H:%M:%SZ")
      end

      def initialize(settings, figures, violations, started_at:, receiver:)
        @settings = settings
        @figures = figures
        @receiver = receiver
        @result = result(violations, started_at)
      end

      def print(out)
        out.puts "soak of #{JOB_TYPE} on Sidekiq #{Sidekiq::VERSION} (#{@result['broker']}), policy " \
                 "#{STALE_CLAIM_POLICY}, effect #{EFFECT_KIND}: #{@settings.workers} worker(s) of " \
                 "`sidekiq #{WORKER.join(' ')}`, one killed with kill -9 every #{@settings.kill_every} s (jittered), " \
                 "and a worker killing itself right after #{format('%g', @settings.kill_after_take * 100)}% of the " \
                 "messages it takes"
        notes.each { |note| out.puts "  #{note}" }
        ROWS.each do |name, label|
          value = @result[name]
          out.puts format("  %-31<label>s %<value>s", label: label, value: value.is_a?(Array) ? value.size : value)
        end
        @result["violations"].each { |violation| out.puts "violation: #{violation}" }
        out.puts @result["passed"] ? "passed" : "FAILED: #{@result['violations'].size} violation(s)"
      end

      # replay-soak.json, and the replay reports again when the replay suite has written them here.
      def write(out)
        File.write(File.join(ROOT, "replay-soak.json"), "#{JSON.pretty_generate(@result)}\n")
        out.puts "wrote replay-soak.json"
        return unless File.exist?(File.join(ROOT, "replay-report.json"))

        require File.join(ROOT, "spec/replay_report")
        ReplayReport.rerender
        out.puts "rendered #{ReplayReport::REPORTS.join(', ')} again from replay-report.json, with this soak"
      rescue LoadError => e
        out.puts "the replay reports were not rendered again: #{e.message} (the mustache gem renders them)"
      end

      private

      def result(violations, started_at)
        seconds = @figures["seconds"]
        {
          "command" => command, "started_at" => started_at, "finished_at" => Outcome.now,
          "queue_system" => "sidekiq", "broker" => broker, "stale_claim_policy" => STALE_CLAIM_POLICY,
          "effect_kind" => EFFECT_KIND, "operations" => @settings.operations,
          **@figures.slice("messages", "duplicates", "bad_messages"), "workers" => @settings.workers,
          "kill_every" => @settings.kill_every, "workers_killed" => @figures["workers_killed"],
          "kill_after_take" => @settings.kill_after_take, "killed_after_take" => @figures["killed_after_take"],
          "connections_ended" => @figures["connections_ended"],
          **%w[effects completed held abandoned lost_resent].to_h { |name| [name, @figures[name]] },
          "violations" => violations, "seconds" => seconds,
          "throughput" => (@settings.operations / [seconds, 0.1].max).round(1), "passed" => violations.empty?
        }
      end

      # What the soak did that production would not, and why.
      def notes
        [
          "#{@figures['killed_after_take']} worker(s) killed themselves right after taking a message, before its " \
          "job ran (a server middleware first in the soak's workers, spec/soak_worker.rb), apart from the " \
          "#{@figures['workers_killed']} the chaos loop killed",
          "the database restarted half-way, as the workers see it: #{@figures['connections_ended']} connection(s) " \
          "ended (pg_terminate_backend)",
          "effects counted at #{@receiver}{{ ', which answers a few ms late so that kills land inside the effect too' if sink else '' }}",
          "open-source Sidekiq loses the job a killed worker holds (no queue, retry or dead entry): " \
{%- if kind.one_transaction %}
          "#{@figures['lost_resent']} key(s) left queued (lost before their claim, or the death rolled the claim " \
          "and the row back together) were sent again by the kit's sweeper, their records aged past the re-send " \
          "time in SQL",
{%- else %}
          "#{@figures['lost_resent']} key(s) lost before their claim, left queued, were sent again by the kit's " \
          "sweeper, their records aged past the re-send time in SQL; a job lost after its claim left the claim to " \
          "the sweeper",
{%- endif %}
          "then, every worker stopped, the claims still claimed were aged past the lease (#{LEASE_SECONDS} s) in SQL " \
          "and the sweeper ran until nothing was stale",
          "#{@figures['refused']} of #{@figures['bad_messages']} bad messages refused with an error in the log, " \
          "#{@figures['buried']} of them in Sidekiq's dead set with the reason (one a killed worker held is lost, " \
          "never retried)",
          ("#{@figures['retried_now']} job(s) of the retry set retried at once" if @figures["retried_now"].positive?),
          ("#{@figures['stuck']} worker(s) stuck #{STOP_SECONDS} s after TERM: threads to the log, kill -9" if stuck?),
          foreign
        ].compact
      end

      def stuck?
        @figures["stuck"].positive?
      end

      # Effects that name no key of the soak: not counted, shown.
      def foreign
        excerpts = @figures["foreign"]
        return if excerpts.empty?

        "#{excerpts.size} effect(s) named no key of this soak, not counted (another program's?): #{excerpts.first}"
      end

      def command
        given = { "OPERATIONS" => @settings.operations, "WORKERS" => @settings.workers,
                  "KILL_EVERY" => @settings.kill_every, "DUPLICATES" => @settings.duplicates,
                  "KILL_AFTER_TAKE" => @settings.kill_after_take, "SEED" => @settings.seed }
        runner = ENV.key?("BUNDLE_GEMFILE") ? "bundle exec rake" : "rake"
        "#{runner} {{ c.project_slug }}:soak #{given.map { |name, value| "#{name}=#{value}" }.join(' ')}"
      end

      def broker
        "Redis #{Sidekiq.redis { |conn| conn.call('INFO', 'server') }[/redis_version:(\S+)/, 1]}"
      end
    end
{%- if sink %}

    # Where the effects arrive: the replay suite's {{ sink[2][4:] }} (spec/{{ sink[1] }}.rb), answering a few ms
    # late so that kills land inside the effect too.
    class Receiver
      DELAY = 0.005

      def initialize(prefix)
        require File.join(ROOT, "spec/{{ sink[1] }}")
        @server = {{ sink[0] }}.new(on_receive: ->(_) { sleep DELAY })
        @key = /#{Regexp.escape(prefix)}\w+/
      end

      def start
        @server.start
        self
      end

      def stop = @server.stop

      def env = @server.env

      def describe = "{{ sink[2] }} on port #{@server.port}"

      # The effects by key{% if c.effect_kind == "external_no_reference" %} (an email that names several counts for each){% endif %}, and an excerpt of each
      # that names none: another program's, which reached this port on a shared machine.
      def effects
        effects = Hash.new(0)
        foreign = []
{%- if c.effect_kind == "external_no_reference" %}
        @server.messages.each do |message|
          keys = message.scan(@key).uniq
          keys.each { |key| effects[key] += 1 }
          foreign << message[0, 120].inspect if keys.empty?
        end
{%- else %}
        @server.references.each do |reference|
          reference.match?(/\A#{@key}\z/) ? effects[reference] += 1 : foreign << reference[0, 120].inspect
        end
{%- endif %}
        [effects, foreign]
      end

      def forget(_connection); end
    end
{%- else %}

    # Where the effects arrive: the effect's own rows, in {{ c.job_type }}_effects.
    class Receiver
      def initialize(prefix)
        @prefix = prefix
      end

      def start = self

      def stop; end

      def env = {}

      def describe = "the effect's rows in {{ c.job_type }}_effects"

      # The effects by key (rows of other keys are not the soak's).
      def effects
        rows = {{ mod }}.with_connection do |connection|
          connection.exec_query(ActiveRecord::Base.sanitize_sql_array([<<~SQL, "#{@prefix}%"])).to_a
            SELECT operation_key, COUNT(*) AS effects FROM {{ c.job_type }}_effects WHERE operation_key LIKE ?
            GROUP BY operation_key
          SQL
        end
        [Hash.new(0).merge(rows.to_h { |row| [row["operation_key"], row["effects"].to_i] }), []]
      end

      def forget(connection)
        sql = "DELETE FROM {{ c.job_type }}_effects WHERE operation_key LIKE ?"
        connection.exec_delete(ActiveRecord::Base.sanitize_sql_array([sql, "#{@prefix}%"]))
      end
    end
{%- endif %}
  end
end
