{%- from "replay_matrix.jinja" import kind, max_key_length with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
# frozen_string_literal: true

# The job `{{ c.job_type }}`, made safe against duplicates and worker deaths, for
# {{ c.project_name }}.
#
# On its own, the worker, the Rakefile and the specs load this file:
# `sidekiq -r ./lib/{{ c.project_slug }}.rb`.
# In a Rails app it lives in app/sidekiq/ (install_into_rails.rb puts it there) and Rails' autoloader loads it.
require "active_record"
require "sidekiq"

# The answers the kit was generated with; POLICY.md explains each. The environment says where things are.
module {{ mod }}
  JOB_TYPE = "{{ c.job_type }}"
  RECORD_TABLE = "{{ c.record_table }}"
  EFFECT_KIND = "{{ c.effect_kind }}"
  STALE_CLAIM_POLICY = "{{ c.stale_claim_policy }}"
  # A claim younger than the lease belongs to a run that is still working; the longest normal run is shorter.
  # (Thousands separated by "_", as rubocop's Style/NumericLiterals asks of 86_400.)
  LEASE_SECONDS = {{ "{:_}".format(c.lease_seconds|int) }}
  LONGEST_RUN_SECONDS = {{ "{:_}".format(c.longest_run_seconds|int) }}
  # The record table's operation_key is VARCHAR({{ max_key_length }}).
  MAX_KEY_LENGTH = {{ max_key_length }}
  # SQS's 256 KiB for a whole message, less 1 KiB for the key and the envelope, as in the kit's other languages.
  MAX_DETAILS_BYTES = 255 * 1024

  # What ActiveRecord 6.1 asks of a record in a transaction, for a block to run after the commit: a savepoint's
  # commit hands it to the outer transaction, a rollback drops it.
  AfterCommit = Struct.new(:block) do
    def trigger_transactional_callbacks? = true

    def before_committed!; end

    def committed!(should_run_callbacks: true)
      block.call if should_run_callbacks
    end

    def rolledback!(**); end
  end

  # Sidekiq's threads start their first jobs together: one of them connects, the others wait for its pool.
  CONNECTING = Mutex.new

  # Redis did not take a message (down, restarting, the network): a record written before it stays queued, and the
  # sweeper sends it again after the re-send time. The message says what to check.
  class QueueUnreachable < StandardError; end

  # How Sidekiq's Redis client says that Redis cannot be reached: redis-rb's (Sidekiq 6), redis-client's (7 and 8).
  REDIS_UNREACHABLE = [(Redis::BaseConnectionError if defined?(Redis::BaseConnectionError)),
                       (RedisClient::ConnectionError if defined?(RedisClient::ConnectionError))].compact.freeze

  class << self
    # The app's connection pool when the app has one (Rails, or any host that connected ActiveRecord): the
    # kit never replaces it. Only when nothing is connected (the kit on its own) does the kit connect, once:
    # ActiveRecord 6.1 gives each thread that calls establish_connection a pool of its own, so a job's claim
    # and its completion could land in two sessions.
    def connection_pool
      ActiveRecord::Base.connection_pool
    rescue ActiveRecord::ConnectionNotEstablished
      CONNECTING.synchronize do
        ActiveRecord::Base.connection_pool
      rescue ActiveRecord::ConnectionNotEstablished
        connect
        ActiveRecord::Base.connection_pool
      end
    end

    # Runs the block on a connection checked out for it and given back after, so that any number of Sidekiq
    # threads share a pool of any size. A thread that already holds one (inside a transaction, or Rails'
    # executor) keeps using it.
    def with_connection(&)
      connection_pool.with_connection(&)
    end

    # The kit on its own: DATABASE_URL chooses the database (postgresql://... in production, a SQLite file when
    # unset). ActiveRecord connects lazily, so this opens nothing yet.
    def connect(url = ENV.fetch("DATABASE_URL", "sqlite3:db/{{ c.project_slug }}.sqlite3"))
      ActiveRecord::Base.establish_connection(url)
      wait_in_ruby_while_sqlite_is_busy
    end

    # How long a record may stay queued (sent, never claimed) before the sweeper sends it again: the broker may
    # have lost the message. RESEND_QUEUED_AFTER_SECONDS, the lease unless set: a message that waits in a long
    # queue is sent again harmlessly (the claim makes the copy a duplicate), but each copy costs a delivery.
    def resend_queued_after
      given = ENV.fetch("RESEND_QUEUED_AFTER_SECONDS", LEASE_SECONDS.to_s)
      seconds = Integer(given, exception: false)
      return seconds if seconds&.positive?

      raise ArgumentError, "RESEND_QUEUED_AFTER_SECONDS must be a whole number of seconds above 0, e.g. " \
                           "#{LEASE_SECONDS} (the lease); got #{given.inspect}"
    end

    # The largest details, in bytes as JSON, that a message may carry: the environment's MAX_DETAILS_BYTES, 255 KiB
    # unless set. Larger ones are refused as bad messages, by enqueue and by the job.
    def max_details_bytes
      given = ENV.fetch("MAX_DETAILS_BYTES", MAX_DETAILS_BYTES.to_s)
      bytes = Integer(given, exception: false)
      return bytes if bytes&.positive?

      raise ArgumentError, "MAX_DETAILS_BYTES must be a whole number of bytes above 0, e.g. #{MAX_DETAILS_BYTES} " \
                           "(255 KiB); got #{given.inspect}"
    end

    # Runs the block once the open ActiveRecord transaction of this thread commits, never if it rolls back; at
    # once when none is open. enqueue's push waits so, beside the record it wrote in that transaction.
    def after_commit(&block)
      connection = connection_pool.active_connection?
      return yield unless connection&.transaction_open?

      if ActiveRecord::Base.respond_to?(:current_transaction) # ActiveRecord 7.2 and later
        ActiveRecord::Base.current_transaction.after_commit(&block)
      else
        connection.add_transaction_record(AfterCommit.new(block))
      end
    end

    # Runs the block that pushes to Redis: Redis unreachable raises QueueUnreachable, in one line.
    def talking_to_the_queue
      yield
    rescue *REDIS_UNREACHABLE => e
      raise QueueUnreachable, "Redis cannot be reached (#{e.message.lines.first.to_s.strip[0, 300]}): " \
                              "check that it runs where REDIS_URL points"
    end

    # QueueUnreachable unless Redis answers now: a person's enqueue asks before it writes the record.
    def check_queue
      talking_to_the_queue { Sidekiq.redis(&:ping) }
    end

    # What became of a record whose message Redis did not take.
    def queued_for_the_sweeper
      "its record is queued: the sweeper sends it again after #{resend_queued_after} s " \
        "(`rake {{ c.project_slug }}:status` shows it)"
    end

    def claims
      @claims ||= Claims.new(job_type: JOB_TYPE, table: RECORD_TABLE, lease_seconds: LEASE_SECONDS,
                             policy: STALE_CLAIM_POLICY, logger: Sidekiq.logger)
    end

    # The kit on its own: creates the tables from db/migrate (run from the kit's root). A new SQLite file is
    # switched to WAL, so readers do not wait for a writer. In a Rails app, `bin/rails db:migrate` does this.
    def migrate!
      pool = connection_pool
      pool.with_connection { |connection| connection.execute("PRAGMA journal_mode = WAL") if sqlite?(connection) }
      # ActiveRecord 7.2 moved the migration context from the connection to the pool.
      context = pool.respond_to?(:migration_context) ? pool.migration_context : nil
      (context || pool.with_connection(&:migration_context)).migrate
    end

    private

    def sqlite?(connection)
      connection.adapter_name == "SQLite"
    end

    # Two threads may write at the same moment; the second waits for the first to commit. sqlite3's own
    # busy_timeout waits holding Ruby's global lock, so the first thread could never commit: wait in Ruby.
    # Set only when the kit connects on its own: an app's SQLite settings are the app's.
    def wait_in_ruby_while_sqlite_is_busy
      return if @sqlite_waits_in_ruby

      @sqlite_waits_in_ruby = true
      ActiveRecord::ConnectionAdapters::AbstractAdapter.set_callback(:checkout, :after) do
        next unless adapter_name == "SQLite"

        raw_connection.busy_handler { |tries| tries < 1000 && sleep(0.005) }
        # raw_connection made this connection begin each transaction at once, and ActiveRecord 8 begins SQLite's
        # as IMMEDIATE (the write lock from the start): begin at the first statement again, as before.
        enable_lazy_transactions!
      end
    end
  end
end

# A worker refuses to start on a database it cannot use (the record table missing or not migrated, a failed
# login): one line saying what to do, rather than jobs that fail one by one. Here, in the file the worker loads
# (in a Rails app, eager loading loads it before Sidekiq starts).
Sidekiq.configure_server do |config|
  config.on(:startup) { {{ mod }}::DatabaseCheck.refuse_to_start_unless_usable }
end

# On its own the kit loads its parts; in a Rails app (app/sidekiq/) Rails' autoloader does, file by file.
unless defined?(Rails.autoloaders)
  # Sidekiq 6.4's fetch passes redis-rb 4.8 its timeout the old way, and redis-rb then logs a deprecation at every
  # poll (some 5 lines a second, none of them the kit's); Sidekiq 6.5 and redis-rb 5 have none. An app keeps its own.
  old_sidekiq = Gem::Version.new(Sidekiq::VERSION) < Gem::Version.new("6.5")
  Redis.silence_deprecations = true if old_sidekiq && Redis.respond_to?(:silence_deprecations=)

  parts = %w[claims database_check effect {{ c.job_type }}_job stale_claim_sweeper_job held_operations]
  parts.each do |part|
    require_relative "{{ c.project_slug }}/#{part}"
  end
end
