{%- from "replay_matrix.jinja" import kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

# What the benchmarks share: the kit, the raw pg floor, timing in alternating blocks, and the verdicts.
#
# The floor is the physical one, measured in the same run on the raw driver: the kit's own statements (as the kit
# prepares them, Claims#sql), prepared once, on the PG::Connection the kit sends them on.
require "etc"
require "optparse"
require "securerandom"
require "tmpdir"
require_relative "../lib/{{ c.project_slug }}"

$stdout.sync = true # each figure as it comes, when the output goes to a file

# Shared by benchmark.rb and scale.rb.
module Measure
  TABLE = {{ mod }}::RECORD_TABLE
  JOB_TYPE = {{ mod }}::JOB_TYPE
  RUN = SecureRandom.hex(4)
  PREFIX = "bench-#{RUN}-".freeze

  module_function

  # DATABASE_URL, refused unless PostgreSQL: the figures are about it. The kit connects to it and migrates.
  def connect!
    abort "set DATABASE_URL to a PostgreSQL test database: the figures are about PostgreSQL" unless
      ENV.fetch("DATABASE_URL", "").start_with?("postgres")
    {{ mod }}.connect
    ActiveRecord::Migration.verbose = false
    {{ mod }}.migrate!
  end

  # The PG::Connection the kit's statements go to{{ ": ActiveRecord's, where they run inside the job's transaction" if kind.one_transaction else ", the thread's own (Claims::Session)" }}.
  # The floor runs on it too, so that both reach the same server process: on a machine with few cores, the core
  # that process gets can change a round trip by half (90 to 190 µs for one statement on two connections here).
  def kit_connection
{%- if kind.one_transaction %}
    ActiveRecord::Base.connection.raw_connection
{%- else %}
    {{ mod }}::Claims::Session.current.connection
{%- endif %}
  end

  # One raw connection to the kit's database, as the kit's own connection gets its parameters, with the server's
  # defaults.
  def raw
    settings = ActiveRecord::Base.connection_db_config.configuration_hash
    PG.connect({{ mod }}::Claims::Session.params(settings))
  end

  # Seconds per operation of each variant: the median over blocks of `block` operations, the variants taking
  # turns block by block (and at going first) so that each sees the same machine.
  def alternating(variants, operations, block: 10)
    blocks = variants.transform_values { [] }
    (0...operations).step(block) do |start|
      variants.to_a.rotate(start / block % variants.size).each do |name, run|
        began = now
        (start...(start + block)).each { |i| run.call(i) }
        blocks[name] << ((now - began) / block)
      end
    end
    blocks.transform_values { |values| median(values) }
  end

  def median(values)
    sorted = values.sort
    (sorted[(sorted.size - 1) / 2] + sorted[sorted.size / 2]) / 2.0
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def verdict(ratio, goal, at_most: true)
    met = at_most ? ratio <= goal : ratio >= goal
    "ratio #{format('%.2f', ratio)} (goal #{at_most ? '<=' : '>='} #{goal}): #{met ? 'PASS' : 'MISS'}"
  end

  def micro(seconds)
    format("%8.1f µs", seconds * 1e6)
  end

  def load
    one, five, fifteen = File.read("/proc/loadavg").split.first(3)
    "load average #{one} #{five} #{fifteen} on #{Etc.nprocessors} cores"
  rescue Errno::ENOENT
    "load average unknown"
  end

  # What the figures were taken on: versions, the server's durability settings, and the machine's load.
  def header(title, raw)
    setting = ->(name) { raw.exec("SHOW #{name}").getvalue(0, 0) }
    puts title
    puts "PostgreSQL #{setting.call('server_version')} (synchronous_commit=#{setting.call('synchronous_commit')}, " \
         "fsync=#{setting.call('fsync')}) at #{raw.host}:#{raw.port}/#{raw.db}; Ruby #{RUBY_VERSION}, " \
         "ActiveRecord #{ActiveRecord::VERSION::STRING}, Sidekiq #{Sidekiq::VERSION}, pg #{PG::VERSION}"
    puts "#{load} at the start: timings on a shared or loaded machine are noisy; compare the ratios, each taken " \
         "within one run, and run it more than once"
    puts
  end

  # The options of a benchmark, with their defaults: name => [default, what it is].
  def options(defaults)
    values = defaults.transform_values(&:first)
    OptionParser.new do |parser|
      defaults.each do |name, (default, what)|
        parser.on("--#{name.to_s.tr('_', '-')} N", Integer, "#{what} (#{default})") { |n| values[name] = n }
      end
    end.parse!
    values
  end
end
