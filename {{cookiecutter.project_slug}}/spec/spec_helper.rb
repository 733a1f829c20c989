{%- from "replay_matrix.jinja" import kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

# The replay suite's setup. Two modes:
#   embedded (default): a SQLite file, Sidekiq::Testing, forked processes that die by SIGKILL;
#   live (DATABASE_URL and REDIS_URL set): PostgreSQL, Redis, real sidekiq processes and a real kill -9.
# The suite creates its tables with the migration in db/migrate and writes replay-report.json at the end, with
# the sign-off reports made from it (replay_report.rb); a run that cannot start writes them too, saying why.
# With REPLAY_HOST_APP=<a Rails app> (live only), it runs in that app instead, on the kit the app holds
# (install_into_rails.rb) and on the app's own connection; `bin/rails db:migrate` made the tables there.
require "json"
require "stringio"
require "tmpdir"
require_relative "replay_report"

LIVE = ENV.key?("DATABASE_URL") || ENV.key?("REDIS_URL")
HOST_APP = ENV.fetch("REPLAY_HOST_APP", nil)
WORK_DIR = Dir.mktmpdir("replay-")

# The report's facts that do not depend on what happens next.
def report_header
  {
    queue_system: "{{ c.queue_system }}", effect_kind: "{{ c.effect_kind }}",
    stale_claim_policy: "{{ c.stale_claim_policy }}", mode: LIVE ? "live" : "embedded",
    started_at: ReplayReport.started_at, machine: ReplayReport.machine
  }
end

ReplayReport.started_at
begin
  if LIVE && !(ENV.key?("DATABASE_URL") && ENV.key?("REDIS_URL"))
    abort "live mode needs both DATABASE_URL (PostgreSQL) and REDIS_URL; set both, or neither for embedded mode"
  end
  abort "REPLAY_HOST_APP runs the live mode only: set DATABASE_URL and REDIS_URL too" if HOST_APP && !LIVE
  # Embedded: the kit connects to this file on its own, as it would to DATABASE_URL.
  ENV["DATABASE_URL"] ||= "sqlite3:#{File.join(WORK_DIR, 'replay.sqlite3')}"
  if HOST_APP
    require File.expand_path("config/environment", HOST_APP)
  else
    require_relative "../lib/{{ c.project_slug }}"
  end
  if LIVE
    require "sidekiq/api"
    # Sidekiq 6.4 on redis-rb 4.8 warns on every push; the answer it warns about is not used.
    Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)
    Sidekiq.configure_client { |config| config.redis = { url: ENV.fetch("REDIS_URL") } }
  elsif Sidekiq.respond_to?(:testing!)
    Sidekiq.testing!(:fake) # Sidekiq 8.1 and later
  else
    require "sidekiq/testing"
    Sidekiq::Testing.fake!
  end

  require_relative "replay_points"
  require_relative "replay_harness"
  {%- if c.effect_kind == "external_no_reference" %}
  require_relative "smtp_sink"
  {%- elif c.effect_kind == "external_with_reference" %}
  require_relative "reference_provider"
  {%- endif %}

  ReplayPoints.dir = File.join(WORK_DIR, "points").tap { |dir| FileUtils.mkdir_p(dir) }
  ReplayPoints.on_crash = :kill_self

  # The job logs what it skips, holds, takes over and refuses; the suite keeps it out of the test output.
  SUITE_LOG = File.join(WORK_DIR, "suite.log")
  Sidekiq.logger.reopen(SUITE_LOG)
  ActiveRecord::Migration.verbose = false
  if HOST_APP
    unless ActiveRecord::Base.connection.table_exists?("{{ c.record_table }}")
      abort "#{HOST_APP} has no table {{ c.record_table }}: run bin/rails db:migrate there first"
    end
  else
    {{ mod }}.migrate!
  end

  # The sink where effects arrive, and the queue the suite delivers through.
  {%- if c.effect_kind == "external_no_reference" %}
  EFFECTS = SmtpSink.new(on_receive: ReplayHarness::EffectArrival).start
  {%- elif c.effect_kind == "external_with_reference" %}
  EFFECTS = ReferenceProvider.new(on_receive: ReplayHarness::EffectArrival).start
  {%- else %}
  EFFECTS = ReplayHarness::EffectRows.new
  {%- endif %}
  EFFECTS.env.each { |name, value| ENV[name] = value }
  # What a live worker needs besides the database: where effects go and where the spec's instructions are.
  WORKER_ENV = EFFECTS.env.merge("REPLAY_POINTS_DIR" => ReplayPoints.dir)
  QUEUE = if LIVE
            Sidekiq.redis { |conn| conn.call("FLUSHDB") }
            ReplayHarness::LiveQueue.new(WORKER_ENV, File.join(WORK_DIR, "sidekiq.log"))
          else
            ReplayHarness::EmbeddedQueue.new(ENV.fetch("DATABASE_URL"))
          end
  QUEUE.start
rescue Exception => e # rubocop:disable Lint/RescueException -- SystemExit from abort too: say why, then stop
  ReplayReport.write(report_header.merge(error: e.message, finished_at: ReplayReport.now, rows: []))
  raise
end

# The broker the suite ran on, for the report.
def report_broker
  return "none: Sidekiq::Testing (embedded mode)" unless LIVE

  "Redis #{Sidekiq.redis { |conn| conn.call('INFO', 'server') }[/redis_version:(\S+)/, 1]}"
end

# The settings the guarantee rests on, as the suite's workers ran with them, for the report.
def report_broker_settings
  job = ReplayHarness::JOB
  retries = "the job's retry #{job.get_sidekiq_options['retry']} (a message pushed by the class's name: " \
            "#{{ '{' }}{{ mod }}::Claims.retries(job)})"
  edition = if defined?(Sidekiq::Pro)
              "Sidekiq Pro #{Sidekiq::Pro::VERSION}"
            else
              "open-source Sidekiq #{Sidekiq::VERSION}: a killed worker's job is lost, not delivered again (the " \
                "record from the send and the sweeper find it)"
            end
  resend = "queued records sent again after #{{ '{' }}{{ mod }}.resend_queued_after} s"
  return "Sidekiq::Testing's fake queue: no Redis, no retries; #{retries}; #{edition}; #{resend}" unless LIVE

  info = Sidekiq.redis { |conn| conn.call("INFO") }
  redis = "Redis maxmemory_policy #{info[/maxmemory_policy:(\S+)/, 1]} (Sidekiq needs noeviction), appendonly " \
          "#{info[/aof_enabled:1/] ? 'yes' : 'no'}"
  "concurrency #{QUEUE.threads}, database pool #{QUEUE.pool_size}; #{retries}, then the dead set; a bad message " \
    "to the dead set at once; #{redis}; #{edition}; #{resend}"
end

RSpec.configure do |config|
  config.include ReplayHarness
  config.disable_monkey_patching!
  config.order = :defined

  # Every example starts with no records, no effects and nothing queued.
  config.before do
    ActiveRecord::Base.connection.execute("DELETE FROM {{ c.record_table }}")
    ActiveRecord::Base.connection.execute("DELETE FROM {{ c.record_table }}_resolutions")
    EFFECTS.clear
    LIVE ? Sidekiq.redis { |conn| conn.call("FLUSHDB") } : Sidekiq::Job.clear_all
  end

  config.after(:suite) do
    QUEUE.stop
    EFFECTS.stop
    FileUtils.rm_rf(WORK_DIR) unless ENV["KEEP_REPLAY_WORK_DIR"]
    # A run of some other spec file alone leaves the last report as it was.
    next if ReplayReport.rows.empty?

    ReplayReport.write(report_header.merge(
                         database: ActiveRecord::Base.connection.adapter_name == "PostgreSQL" ? "postgresql" : "sqlite",
                         rows: ReplayReport.rows.sort_by { |row| row[:case] },
                         environment: ReplayReport.environment(broker: report_broker, settings: report_broker_settings,
                                                               host_app: HOST_APP),
                         finished_at: ReplayReport.now
                       ))
  end
end

# Uses EFFECTS and QUEUE through ReplayHarness.
module ReplayHarness
  def effects
    EFFECTS
  end

  def queue
    QUEUE
  end
end
