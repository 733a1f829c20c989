{%- from "replay_matrix.jinja" import kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
# frozen_string_literal: true

require "json"
require "rbconfig"
require "securerandom"
require "timeout"

# How the replay suite delivers a message, kills a worker at a crash point and redelivers, in either mode:
#   embedded: SQLite, Sidekiq::Testing (fake), a forked process that kills itself with SIGKILL;
#   live:     PostgreSQL, Redis, real `sidekiq` processes, and the spec's own kill -9.
# Deliveries block until the job has finished. Effects are counted where they arrive.
module ReplayHarness
  JOB = {{ mod }}::{{ job }}
  TABLE = {{ mod }}::RECORD_TABLE

  # What a case observed, read from the database: the key's status, or "none" when it has no record.
  def record(key)
    {{ mod }}.claims.read(key)&.fetch("status") || "none"
  end

  # Ages the key's claim past the lease in SQL, on the database's own clock.
  def age_past_lease(key)
    seconds = {{ mod }}::LEASE_SECONDS + 1
    shift = if ActiveRecord::Base.connection.adapter_name == "PostgreSQL"
              "claimed_at - make_interval(secs => :seconds)"
            else
              "claimed_at - :seconds / 86400.0"
            end
    sql = "UPDATE #{TABLE} SET claimed_at = #{shift} WHERE job_type = :job_type AND operation_key = :key"
    binds = { seconds:, key:, job_type: {{ mod }}::JOB_TYPE }
    ActiveRecord::Base.connection.exec_update(ActiveRecord::Base.sanitize_sql_array([sql, binds]))
  end

  # What the block returned, and what was logged to `path` meanwhile (by the live worker, or this process).
  def logged(path = queue.log_path)
    start = File.exist?(path) ? File.size(path) : 0
    result = yield
    [result, File.exist?(path) ? File.binread(path)[start..].to_s.force_encoding(Encoding::UTF_8) : ""]
  end

  def records_count
    ActiveRecord::Base.connection.select_value("SELECT COUNT(*) FROM #{TABLE}").to_i
  end

  # What to do when an effect arrives, before its sender hears so (the sink or the provider calls it): a fault
  # spec stops the database there. Nothing by default.
  module EffectArrival
    class << self
      attr_accessor :hook

      def call(_effect)
        hook&.call
      end
    end
  end

{%- if kind.one_transaction %}

  # Counts the effect's rows in its own table: the effect is a row in the same database.
  class EffectRows
    def env
      {}
    end

    def count
      ActiveRecord::Base.connection.select_value("SELECT COUNT(*) FROM {{ c.job_type }}_effects").to_i
    end

    def clear
      ActiveRecord::Base.connection.execute("DELETE FROM {{ c.job_type }}_effects")
    end

    def stop; end
  end
{%- endif %}

  # Runs deliveries in this process with Sidekiq::Testing's fake queue and drain.
  class EmbeddedQueue
    def initialize(database_url)
      @database_url = database_url
    end

    def start; end

    def stop; end

    def deliver(*args)
      JOB.perform_async(*args)
      message = JOB.jobs.last.dup
      JOB.drain
      message
    end

    def redeliver(message)
      Sidekiq::Client.push(message)
      JOB.drain
    end

    # Two runs of the same message at once, in two threads that meet at a barrier right before they claim.
    def deliver_concurrently(key)
      2.times { JOB.perform_async(key) }
      messages = JOB.jobs.map(&:dup)
      JOB.clear
      ReplayPoints.hold_at_barrier(key)
      messages.map do |message|
        Thread.new { JOB.process_job(message) }
      end.each(&:join)
    ensure
      ReplayPoints.clear
    end

    # Takes the message off the queue, as a fetch does, and runs it in a forked process that kills itself
    # with SIGKILL at the crash point. The message is gone: nothing puts it back.
    def deliver_and_die(key, at:)
      JOB.perform_async(key)
      message = JOB.jobs.first.dup
      JOB.clear
      ReplayPoints.crash_at(key, at)
      status = run_in_doomed_process(message)
      raise "the worker did not die by SIGKILL at #{at}: #{status.inspect}" unless status.termsig == 9
      raise "the message came back: #{JOB.jobs.inspect}" unless JOB.jobs.empty?

      message
    ensure
      ReplayPoints.clear
    end

    def sweep
      {{ mod }}::StaleClaimSweeperJob.perform_async
      {{ mod }}::StaleClaimSweeperJob.drain
    end

    # A message as a producer might send it, run like any other: "returned", or "raised" when an error
    # escaped the job (Sidekiq retries only those).
    def deliver_raw(args)
      Sidekiq::Client.push("class" => JOB, "args" => args)
      JOB.drain
      "returned"
    rescue StandardError
      "raised"
    end

    # A message as another program might write it, JSON text with any bytes in it (a push through Sidekiq
    # would refuse those), parsed as Sidekiq's processor parses it and run.
    def deliver_json(json)
      JOB.process_job(Sidekiq.load_json(json))
      "returned"
    rescue StandardError
      "raised"
    end

    # Runs what was enqueued (the job with this jid among them).
    def finish(_jid)
      JOB.drain
    end

    # Runs every message at once on more threads than the pool has connections; "returned" or "raised" each.
    def flood(messages)
      work = Queue.new.tap { |queue| messages.each { |args| queue << args } }.tap(&:close)
      outcomes = Queue.new
      Array.new(threads) do
        Thread.new do
          while (args = work.pop)
            outcomes << run(args)
          end
        end
      end.each(&:join)
      Array.new(outcomes.size) { outcomes.pop }
    end

    # "returned", or "raised" when an error escaped the job.
    def run(args)
      JOB.process_job("class" => JOB.name, "args" => args)
      "returned"
    rescue StandardError
      "raised"
    end

    def threads
      pool_size + 4
    end

    def pool_size
      {{ mod }}.connection_pool.size
    end

    def leftovers
      { queued: JOB.jobs.size }
    end

    def log_path
      SUITE_LOG
    end

    private

    def run_in_doomed_process(message)
      # The child opens its own database connection rather than share the parent's.
      ActiveRecord::Base.connection_pool.disconnect!
      pid = fork do
        {{ mod }}.connect(@database_url)
        JOB.process_job(message)
        exit!(0) # not reached when the crash point kills the process
      rescue StandardError => e
        warn(e.full_message)
        exit!(1) # exit! in the child: the parent's at_exit hooks (RSpec's) are not the child's to run
      end
      Process.wait2(pid).last
    end
  end

  # Runs deliveries on real `sidekiq` processes through Redis.
  class LiveQueue
    TIMEOUT = 20
    # The worker's pool is smaller than Sidekiq's default concurrency: the job must share it.
    POOL = 2

    # Workers asked to stop and not waited for yet.
    def self.stopping
      @stopping ||= []
    end

    # The worker takes the Sidekiq queue `queue` and reaches the database at `database_url`; the fault specs'
    # worker has a queue of its own, its database through a proxy they stop, and one thread: the job after a cut
    # is the next to need a connection, and must open another.
    def initialize(env, log_path, queue: "default", database_url: ENV.fetch("DATABASE_URL"), concurrency: nil)
      @env = env
      @log_path = log_path
      @queue = queue
      @database_url = database_url
      @options = concurrency ? ["-c", concurrency.to_s] : []
    end

    # A sidekiq process at Sidekiq's default concurrency (unless told), on a database pool of POOL connections.
    def start
      url = @database_url
      env = @env.merge("DATABASE_URL" => "#{url}#{url.include?('?') ? '&' : '?'}pool=#{POOL}")
      @pid = Process.spawn(env, RbConfig.ruby, Gem.bin_path("sidekiq", "sidekiq"),
                           "-r", "./spec/live_worker.rb", "-q", @queue, *@options,
                           out: [@log_path, "a"], err: [@log_path, "a"])
      ready = File.join(ReplayPoints.dir, "ready-#{@pid}")
      wait_until("the sidekiq worker #{@pid} started") { File.exist?(ready) }
      @worker = JSON.parse(File.read(ready))
    end

    # The started worker's Sidekiq concurrency and database pool size.
    def threads
      @worker.fetch("concurrency")
    end

    def pool_size
      @worker.fetch("pool")
    end

    # Asks the worker to stop (TERM) and waits for every worker asked so far; with wait: false it goes on at once.
    # Sidekiq takes about 2 s to stop while its fetch waits on Redis, so the suite's workers stop side by side.
    def stop(wait: true)
      if @pid
        Process.kill(:TERM, @pid)
        LiveQueue.stopping << @pid
        @pid = nil
      end
      Process.wait(LiveQueue.stopping.shift) while wait && LiveQueue.stopping.any?
    end

    def deliver(*args)
      message = { "class" => JOB.name, "args" => args, "queue" => @queue, "jid" => SecureRandom.hex(12) }
      redeliver(message)
      message
    end

    # Sends one message as the app does (with the job's own options: its retries) and returns its jid at once.
    def push(*args)
      JOB.set(queue: @queue).perform_async(*args)
    end

    # The entry Sidekiq's retry kept for the job, once the job has failed and been put there.
    def retried(jid)
      entry = nil
      wait_until("job #{jid} in the retry set") { entry = Sidekiq::RetrySet.new.find_job(jid) }
      entry
    end

    # The retry's time has come: moved from the retry set to its queue, retry count and all, as Sidekiq's
    # scheduler does; "returned" or "raised" once it has run.
    def retry_now(entry)
      ReplayPoints.forget(entry.jid)
      entry.add_to_queue
      wait_for(entry.jid)
    end

    # Stops the whole worker process with SIGSTOP, as a frozen machine would, and returns once every one of its
    # threads has stopped (a thread may run on a moment after the signal).
    def freeze
      Process.kill(:STOP, @pid)
      wait_until("the worker #{@pid} stopped") do
        Dir.glob("/proc/#{@pid}/task/*/stat").all? { |stat| File.read(stat)[/\) (\S)/, 1] == "T" }
      rescue Errno::ENOENT
        false # a thread ended meanwhile: look again
      end
    end

    def thaw
      Process.kill(:CONT, @pid)
    end

    # The same message again, jid and all, as a client retry or a reliable fetch would push it. The first run's
    # outcome is forgotten first, so that this waits for the second run.
    def redeliver(message)
      ReplayPoints.forget(message["jid"])
      Sidekiq::Client.push(message.dup)
      wait_for(message["jid"])
    end

    def deliver_concurrently(key)
      ReplayPoints.hold_at_barrier(key)
      jids = Array.new(2) { JOB.perform_async(key) }
      jids.each { |jid| wait_for(jid) }
    ensure
      ReplayPoints.clear
    end

    # Pushes the message, waits until the worker has reached the crash point, and kills it with kill -9. The
    # message is lost, as in open-source Sidekiq: not queued, not retried, not dead. A new worker starts.
    def deliver_and_die(key, at:)
      ReplayPoints.crash_at(key, at)
      message = { "class" => JOB.name, "args" => [key], "queue" => @queue, "jid" => SecureRandom.hex(12) }
      Sidekiq::Client.push(message.dup)
      wait_until("the worker reached #{at}") { ReplayPoints.reached?(key) }
      kill_worker
      assert_lost(message)
      message
    ensure
      ReplayPoints.clear
      start unless @pid
    end

    def sweep
      wait_for({{ mod }}::StaleClaimSweeperJob.set(queue: @queue).perform_async)
    end

    def deliver_raw(args)
      wait_for(Sidekiq::Client.push("class" => JOB.name, "args" => args, "queue" => @queue))
    end

    # A message as another program might write it: JSON text with any bytes in it, put on the queue's list in
    # Redis as it is (a push through Sidekiq would refuse such bytes). Its jid, at once.
    def push_json(json)
      Sidekiq.redis do |conn|
        conn.call("SADD", "queues", @queue)
        conn.call("LPUSH", "queue:#{@queue}", json)
      end
      Sidekiq.load_json(json)["jid"]
    rescue JSON::ParserError
      nil # the worker cannot read it either
    end

    def deliver_json(json)
      wait_for(push_json(json))
    end

    def finish(jid)
      wait_for(jid)
    end

    # "returned" or "raised": whether an error escaped the job (Sidekiq retries only those).
    def wait_for(jid)
      outcome = nil
      wait_until("job #{jid} finished") { outcome = ReplayPoints.outcome(jid) }
      outcome
    end

    # Pushes every message at once to the one worker; "returned" or "raised" for each once all have finished.
    def flood(messages)
      jids = messages.map { |args| Sidekiq::Client.push("class" => JOB.name, "args" => args, "queue" => @queue) }
      jids.map { |jid| wait_for(jid) }
    end

    attr_reader :log_path, :pid

    # Sidekiq's own view: nothing queued, scheduled, retrying or dead.
    def leftovers
      { queued: Sidekiq::Queue.new(@queue).size, scheduled: Sidekiq::ScheduledSet.new.size,
        retries: Sidekiq::RetrySet.new.size, dead: Sidekiq::DeadSet.new.size }
    end

    private

    def kill_worker
      Process.kill(:KILL, @pid)
      status = Process.wait2(@pid).last
      @pid = nil
      raise "the worker did not die by SIGKILL: #{status.inspect}" unless status.termsig == 9
    end

    def assert_lost(message)
      left = leftovers
      raise "the killed job was not lost: #{left}" unless left.values.all?(&:zero?)
      raise "the killed job finished: #{message['jid']}" if ReplayPoints.outcome(message["jid"])
    end

    def wait_until(what)
      Timeout.timeout(TIMEOUT, RuntimeError, "timed out waiting until #{what}; see #{@log_path}") do
        sleep 0.02 until yield
      end
    end
  end
end
