{%- from "replay_matrix.jinja" import kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
{%- set one_transaction = kind.one_transaction -%}
# frozen_string_literal: true

# What the claim costs against the physical floor, measured in the same run: figures printed, not a test.
#
#   DATABASE_URL=postgresql://... REDIS_URL=redis://... ruby benchmarks/benchmark.rb
#
# 1. claim + complete: the job's perform with a no-op effect, against the statements it sends replayed on the
#    PG::Connection it sends them on
#    ({{ "one durable commit: the claim and the completion share a transaction" if one_transaction else "two durable commits" }}). Goal: at most 1.25 times.
{%- if one_transaction %}
#    Also shown: the same statements in a transaction of the app's ActiveRecord, which the job cannot do without,
#    with the payload's fingerprint, which every claim takes.
{%- endif %}
# 2. a duplicate: the job's perform on a completed key, against one raw round trip of the statement it sends.
#    Goal: at most 1.5 times. Also shown: that round trip plus the Ruby work every duplicate must do (the
#    payload's fingerprint, the skip's log line), which the goal's floor leaves out.
# 3. throughput of a real sidekiq process (Sidekiq's default concurrency), one effect per job to a local sink,
#    with the kit's job against a bare job that only performs the effect. Goal: at least 0.85 times. Also shown:
#    the floor's job (goal 1's statements, raw, around the same effect) over the bare job, the best a claim can do.
#
# Each pair takes turns in one run, so that both see the same machine. Use a test database and Redis: the
# benchmark writes records whose keys start with "bench-" and deletes them at the end, and runs its jobs on a
# queue of its own.
require "sidekiq/api"
require_relative "measure"
{%- if c.effect_kind == "external_no_reference" %}
require_relative "../spec/smtp_sink"
{%- elif c.effect_kind == "external_with_reference" %}
require_relative "../spec/reference_provider"
{%- endif %}

# Goal 3's rounds last a second or more, for steady figures: a job whose effect is a row takes about a millisecond.
OPTIONS = Measure.options(operations: [2000, "operations per variant, goals 1 and 2"],
                          jobs: [{{ 2000 if one_transaction else 300 }}, "jobs per variant and round, goal 3"],
                          rounds: [3, "rounds, goal 3"])
PREFIX = Measure::PREFIX
JOB = {{ mod }}::{{ job }}
LOG = File.join(Dir.tmpdir, "bench-#{Measure::RUN}.log")

# The effect of goals 1 and 2: nothing, so that only the claim is timed (in this process only).
module NoEffect
  def perform(*)
    nil
  end
end
{{ mod }}::Effect.singleton_class.prepend(NoEffect)

# The kit's claim and completion statements, prepared on the kit's own connection: the floor replays them there.
def prepare_floor(raw)
  raw.prepare("floor_claim", {{ mod }}.claims.sql(:claim))
  raw.prepare("floor_complete", {{ mod }}.claims.sql(:complete))
  raw
end

def claim_and_complete(raw, operations)
  job = JOB.new
  job.perform("#{PREFIX}first") # this thread's connection opened, the statements prepared
  variants = claim_and_complete_variants(raw, job)
  Measure.alternating(variants.transform_values { |run| ->(i) { run.call("warm-#{i}") } }, 100)
  figures = Measure.alternating(variants, operations)
  report("1. claim + complete: the job's perform with a no-op effect, against the floor",
         ["perform, a new key each time",
          "floor: the 2 statements, raw, {{ 'in one commit' if one_transaction else 'a commit each' }}"],
         "#{first_line(:claim)}, then #{first_line(:complete)}", figures, 1.25)
{%- if one_transaction %}
  puts "   the floor in a transaction of the app's ActiveRecord, which the job needs (the effect writes its row " \
       "through ActiveRecord, in the same transaction), with the payload's fingerprint, which every claim takes: " \
       "#{Measure.micro(figures['app']).strip}, " \
       "#{format('%.2f', figures['app'] / figures['floor'])} times the floor; " \
       "the job's perform is #{format('%.2f', figures['perform'] / figures['app'])} times that"
{%- endif %}
  puts
end

def claim_and_complete_variants(raw, job)
  details = {{ mod }}::Effect.details_for("#{PREFIX}first")
  fingerprint = job.send(:fingerprint, "#{PREFIX}first", details)
  statements = lambda do |connection, key, print = fingerprint|
    token = connection.exec_prepared("floor_claim", [key, print])[0]["claim_token"]
    connection.exec_prepared("floor_complete", [key, token])
  end
  perform = ->(key) { job.perform("#{PREFIX}perform-#{key}") }
{%- if one_transaction %}
  floor = ->(key) { raw.transaction { statements.call(raw, "#{PREFIX}floor-#{key}") } }
  # the same, in a transaction of the app's ActiveRecord (which sends BEGIN when asked for its raw connection), with
  # the payload's fingerprint
  app = lambda do |key|
    key = "#{PREFIX}app-#{key}"
    print = job.send(:fingerprint, key, {{ mod }}::Effect.details_for(key))
    {{ mod }}.with_connection do |connection|
      connection.transaction { statements.call(connection.raw_connection, key, print) }
    end
  end
  { "perform" => perform, "floor" => floor, "app" => app }
{%- else %}
  { "perform" => perform, "floor" => ->(key) { statements.call(raw, "#{PREFIX}floor-#{key}") } }
{%- endif %}
end

def duplicate(raw, operations)
  job = JOB.new
  done = "#{PREFIX}done"
  job.perform(done)
  raise "#{done} was not completed" unless {{ mod }}.claims.read(done)["status"] == "completed"

  variants = duplicate_variants(raw, job, done)
  Measure.alternating(variants, 100)
  figures = Measure.alternating(variants, operations)
  report("2. a duplicate: the job's perform on a completed key, against one raw round trip of the statement it sends",
         ["perform, the same completed key ({{ "3 statements" if one_transaction else "1 statement" }})", "floor: one round trip"],
         first_line(:claim), figures, 1.5)
{%- if one_transaction %}
  puts "   the round trip in a transaction of the app's ActiveRecord (BEGIN, COMMIT: the claim opens the " \
       "transaction that the effect shares) with the work every duplicate must do in Ruby (the payload's " \
       "fingerprint, the skip's " \
{%- else %}
  puts "   the round trip with the work every duplicate must do in Ruby (the payload's fingerprint, the skip's " \
{%- endif %}
       "log line): #{Measure.micro(figures['required']).strip}, " \
       "#{format('%.2f', figures['required'] / figures['floor'])} times the floor; " \
       "the job's perform is #{format('%.2f', figures['perform'] / figures['required'])} times that"
  puts
end

def duplicate_variants(raw, job, done)
  fingerprint = -> { job.send(:fingerprint, done, {{ mod }}::Effect.details_for(done)) }
  values = [done, fingerprint.call]
  lines = logged(Sidekiq.logger) { job.perform(done) }
  required = lambda do |_|
{%- if one_transaction %}
    # the claim opens the transaction that the effect shares (the app's ActiveRecord's: the effect writes through
    # it), before it knows whether the key is new
    {{ mod }}.with_connection do |connection|
      connection.transaction { connection.raw_connection.exec_prepared("floor_claim", [done, fingerprint.call]).values }
    end
{%- else %}
    raw.exec_prepared("floor_claim", [done, fingerprint.call]).values
{%- endif %}
    lines.each { |severity, line| Sidekiq.logger.public_send(severity, line) }
  end
  { "perform" => ->(_) { job.perform(done) }, "floor" => ->(_) { raw.exec_prepared("floor_claim", values).values },
    "required" => required }
end

# The lines the kit logged while the block ran, as [severity, line], read by the logger's formatter (its standard
# hook) instead of being written: the required work logs them again, as the kit does.
def logged(logger)
  formatter = logger.formatter
  lines = []
  logger.formatter = lambda do |severity, _time, _program, line|
    lines << [severity.downcase, line]
    ""
  end
  yield
  lines
ensure
  logger.formatter = formatter
end

def report(title, (kit, floor), statements, figures, goal)
  puts title
  puts "   #{kit.ljust(48)} #{Measure.micro(figures['perform'])}"
  puts "   #{floor.ljust(48)} #{Measure.micro(figures['floor'])}"
  puts "     #{statements}"
  puts "   #{Measure.verdict(figures['perform'] / figures['floor'], goal)}"
end

def first_line(name)
  words = {{ mod }}.claims.sql(name).split.join(" ")
  words.size <= 60 ? words : "#{words[0, 57]}..."
end

# Where the effects arrive, as the replay suite counts them.
{%- if c.effect_kind == "external_no_reference" %}
def effects_sink
  sink = SmtpSink.new.start
  [sink.env, -> { sink.count }, -> { sink.stop }]
end
{%- elif c.effect_kind == "external_with_reference" %}
def effects_sink
  sink = ReferenceProvider.new.start
  [sink.env, -> { sink.count }, -> { sink.stop }]
end
{%- else %}
def effects_sink
  count = lambda do
    ActiveRecord::Base.connection.select_value(
      "SELECT COUNT(*) FROM {{ c.job_type }}_effects WHERE operation_key LIKE '#{PREFIX}%'"
    ).to_i
  end
  [{}, count, -> {}]
end
{%- endif %}

def sidekiq_concurrency
  # Sidekiq 7 and later keep settings in the config; 6.4 in Sidekiq.options.
  (Sidekiq.respond_to?(:default_configuration) ? Sidekiq.default_configuration : Sidekiq.options)[:concurrency]
end

# A real sidekiq process on the benchmark's queue, at Sidekiq's default concurrency, with a database pool as large.
def start_worker(queue, env)
  url = ENV.fetch("DATABASE_URL")
  env = env.merge("DATABASE_URL" => "#{url}#{url.include?('?') ? '&' : '?'}pool=#{sidekiq_concurrency}")
  Process.spawn(env, RbConfig.ruby, Gem.bin_path("sidekiq", "sidekiq"), "-r", "./benchmarks/bench_worker.rb",
                "-q", queue, chdir: File.join(__dir__, ".."), out: [LOG, "a"], err: [LOG, "a"])
end

def wait_until(what, seconds = 300)
  deadline = Measure.now + seconds
  until yield
    raise "timed out waiting until #{what}; the worker's log: #{LOG}" if Measure.now > deadline

    sleep 0.002
  end
end

# Seconds until `jobs` jobs of the class have all performed their effect.
def run_jobs(queue, job_class, keys, count)
  target = count.call + keys.size
  began = Measure.now
  Sidekiq::Client.push_bulk("class" => job_class, "queue" => queue, "args" => keys.map { |key| [key] })
  wait_until("#{keys.size} #{job_class} jobs performed their effect") { count.call >= target }
  Measure.now - began
end

# Jobs per second of each class, round after round, the classes taking turns.
def rates(queue, classes, count, jobs, rounds)
  rates = classes.transform_values { [] }
  rounds.times do |round|
    order = round.even? ? classes.to_a : classes.to_a.reverse
    order.each do |name, job_class|
      keys = Array.new(jobs) { |i| "#{PREFIX}#{round}-#{name}-#{i}" }
      rates[name] << (jobs / run_jobs(queue, job_class, keys, count))
    end
  end
  rates
end

def throughput(jobs, rounds)
  queue = "bench_#{Measure::RUN}"
  env, count, stop = effects_sink
  worker = start_worker(queue, env)
  classes = { "claimed" => JOB.name, "floor" => "{{ mod }}::BenchFloorJob",
              "bare" => "{{ mod }}::BenchBareJob" }
  begin
    classes.each_value { |name| run_jobs(queue, name, Array.new(20) { |i| "#{PREFIX}warm-#{name}-#{i}" }, count) }
    measured = rates(queue, classes, count, jobs, rounds)
    left = ActiveRecord::Base.connection.select_value(<<~SQL).to_i
      SELECT COUNT(*) FROM {{ c.record_table }} WHERE operation_key LIKE '#{PREFIX}%-claimed-%' AND status <> 'completed'
    SQL
    raise "#{left} claimed job(s) of the benchmark did not complete; see #{LOG}" unless left.zero?

    report_throughput(measured)
  ensure
    Process.kill(:TERM, worker)
    Process.wait(worker)
    Sidekiq::Queue.new(queue).clear
    stop.call
  end
end

def each_round(rates)
  rates.values_at("claimed", "floor", "bare").transpose.map { |round| round.map(&:round).join("/") }.join(", ")
end

def report_throughput(rates)
  claimed, floor, bare = rates.values_at("claimed", "floor", "bare").map { |values| Measure.median(values) }
  puts "3. throughput of one sidekiq process (concurrency #{sidekiq_concurrency}), one effect per job, " \
       "median of #{rates['claimed'].size} rounds"
  { "with the claim (the kit's job)" => claimed, "floor: its statements, raw, around the effect" => floor,
    "bare: the effect alone" => bare }.each do |name, rate|
    puts "   #{name.ljust(48)} #{format('%8.1f', rate)} jobs/s  #{format('%6.2f', 1e3 / rate)} ms a job"
  end
  puts "   rounds (with the claim/floor/bare): #{each_round(rates)}"
  puts "   the floor over bare: #{format('%.2f', floor / bare)}; with the claim over the floor: " \
       "#{format('%.2f', claimed / floor)}"
  puts "   #{Measure.verdict(claimed / bare, 0.85, at_most: false)}"
  puts
end

abort "set REDIS_URL: goal 3 runs a real sidekiq process" if ENV.fetch("REDIS_URL", "").empty?
Measure.connect!
Sidekiq.logger.reopen(LOG) # the job logs every skip, as in production
Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)
raw = Measure.raw
floor = prepare_floor(Measure.kit_connection)
Measure.header("The claim against the physical floor: #{OPTIONS[:operations]} operations per variant", raw)
begin
  claim_and_complete(floor, OPTIONS[:operations])
  duplicate(floor, OPTIONS[:operations])
  throughput(OPTIONS[:jobs], OPTIONS[:rounds])
  puts "#{Measure.load} at the end; the log: #{LOG}"
ensure
{%- if one_transaction %}
  raw.exec("DELETE FROM {{ c.job_type }}_effects WHERE operation_key LIKE '#{PREFIX}%'")
{%- endif %}
  raw.exec("DELETE FROM {{ c.record_table }} WHERE operation_key LIKE '#{PREFIX}%'")
  raw.close
end
