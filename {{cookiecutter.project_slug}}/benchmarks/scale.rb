{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
{%- set t = c.record_table -%}
# frozen_string_literal: true

# The claim at scale, on PostgreSQL: figures printed, not a test.
#
#   DATABASE_URL=postgresql://... ruby benchmarks/scale.rb
#
# It fills the record with --rows completed records (1,000,000), completed over the last 60 days, then:
# 1. every guarded update (complete, release, settle, take over) with no backlog, then with --backlog claims
#    (100,000) in the table, with the statistics taken while nothing was claimed (as they are at scale) and
#    fresh; goal: at most 1.2 times the time with no backlog;
# 2. a duplicate and the guarded updates stay index lookups, whatever the statistics (their plans, with EXPLAIN);
# 3. the sweeper drains --stale claims (10,000) older than the lease, under `hold`; goal: at most 30 s;
# 4. the sizes of the table and its indexes, before and after `retain` deletes the records older than --days (30).
#
# It needs an empty record table (a test database): it fills it, and empties it at the end. Autovacuum is off for
# the table while it runs, so that the statistics stay those the benchmark took.
require_relative "measure"

OPTIONS = Measure.options(rows: [1_000_000, "completed records"], backlog: [100_000, "claims in the backlog"],
                          stale: [10_000, "stale claims for the sweeper"], samples: [300, "timings per figure"],
                          days: [30, "the age retain deletes"])
TABLE = Measure::TABLE
PREFIX = Measure::PREFIX
GUARDED = %w[complete release settle take_over].freeze
# A table of one row, for the single-row commit timed beside the kit's statements.
SCRATCH = "bench_#{Measure::RUN}_commit".freeze

def sql(text)
  ActiveRecord::Base.connection.execute(text)
end

def value(text)
  ActiveRecord::Base.connection.select_value(text)
end

# Records of `count` keys named prefix-n in `status`, written as the kit writes them, in chunks of 100,000.
def fill(prefix, count, status, claimed_at: "clock_timestamp()")
  (1..count).step(100_000) do |first|
    last = [first + 99_999, count].min
    completed = status == "completed" ? "clock_timestamp() - make_interval(days => n % 60, secs => n % 86400)" : "NULL"
    sql(<<~SQL)
      INSERT INTO #{TABLE} (job_type, operation_key, payload_fingerprint, status, claim_token, attempt, claimed_at,
                            completed_at)
      SELECT '#{Measure::JOB_TYPE}', '#{prefix}' || lpad(n::text, 7, '0'), md5(n::text) || md5(n::text), '#{status}',
             md5(n::text)::uuid::text, 1, #{status == 'completed' ? completed : claimed_at}, #{completed}
      FROM generate_series(#{first}, #{last}) AS n
    SQL
  end
end

# After a bulk write: its dirty pages written out now, not while the next phase is timed (best effort: CHECKPOINT
# needs a superuser or pg_checkpoint).
def settle_disk
  sql("CHECKPOINT")
rescue ActiveRecord::StatementInvalid => e
  puts "   (no CHECKPOINT: #{e.message.lines.first.strip})"
end

def sizes
  indexes = ActiveRecord::Base.connection.select_rows(<<~SQL)
    SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index
    WHERE indrelid = '#{TABLE}'::regclass ORDER BY 1
  SQL
  { "rows" => value("SELECT COUNT(*) FROM #{TABLE}").to_i, "table" => value("SELECT pg_relation_size('#{TABLE}')").to_i,
    **indexes.to_h.transform_values(&:to_i) }
end

def mib(bytes)
  format("%.1f MiB", bytes / 1_048_576.0)
end

def print_sizes(title, figures)
  details = figures.except("rows").map { |name, bytes| "#{name} #{mib(bytes)}" }.join(", ")
  puts "   #{title}: #{figures['rows']} rows; #{details}"
end

# The kit's claims, and the same with the hold policy whatever this kit's (settle is hold's statement).
def claims(policy = {{ mod }}::STALE_CLAIM_POLICY)
  {{ mod }}::Claims.new(
    job_type: Measure::JOB_TYPE, table: TABLE, policy: policy, logger: Sidekiq.logger,
    lease_seconds: {{ mod }}::LEASE_SECONDS
  )
end

def timed(times, name)
  began = Measure.now
  yield
  (times[name] ||= []) << (Measure.now - began)
end

# Median seconds of a duplicate and of each guarded update, each update on a claim of its own made for it (not
# timed); settle is the hold policy's statement whatever this kit's policy. Beside them, one single-row commit on
# a table of its own: what a commit costs on this machine at that moment, which the phases are compared by.
def timings(phase, samples, done)
  kit = claims
  hold = claims("hold")
  times = {}
  samples.times do |i|
    key = "#{PREFIX}#{phase}-#{i}-"
    timed(times, "one commit") { RAW.exec_prepared("one_commit") }
    timed(times, "duplicate") { kit.claim(done, "fingerprint") }
    claim = kit.claim("#{key}complete", "fingerprint")
    timed(times, "complete") { kit.complete(claim) }
    claim = kit.claim("#{key}release", "fingerprint")
    timed(times, "release") { kit.release(claim, "benchmark") }
    claim = kit.claim("#{key}settle", "fingerprint")
    sql("UPDATE #{TABLE} SET claimed_at = claimed_at - interval '1 day' " \
        "WHERE job_type = '#{Measure::JOB_TYPE}' AND operation_key = '#{claim.key}'")
    timed(times, "settle") { hold.apply_policy(claim.key, claim.token) }
    claim = kit.claim("#{key}take_over", "fingerprint")
    kit.release(claim, "benchmark")
    timed(times, "take_over") { kit.send(:take_over, claim.key, claim.token, "benchmark") }
  end
  times.transform_values { |values| Measure.median(values) }
end

# The pages (buffers) each guarded update touches, run on a claim made for it and rolled back: what a plan that
# walked the claimed rows would show in thousands, whatever the machine's load.
def pages(phase)
  kit = claims
  GUARDED.to_h do |name|
    claim = kit.claim("#{PREFIX}#{phase}-pages-#{name}", "fingerprint")
    values = { "complete" => [claim.key, claim.token], "release" => [claim.key, claim.token, "benchmark"],
               "settle" => [claim.key, claim.token, "held", "benchmark"],
               "take_over" => [claim.key, claim.token, "benchmark"] }.fetch(name)
    kit.release(claim, "benchmark") if name == "take_over"
    if name == "settle"
      sql("UPDATE #{TABLE} SET claimed_at = claimed_at - interval '1 day' " \
          "WHERE job_type = '#{Measure::JOB_TYPE}' AND operation_key = '#{claim.key}'")
    end
    buffers = kit.plan(name.to_sym, *values, run: true)[/Buffers: ([^\n]*)/, 1].to_s
    kit.complete(claim) unless name == "take_over" # rolled back: the claim is left for the sweeper otherwise
    [name, buffers.scan(/(?:hit|read)=(\d+)/).flatten.sum(&:to_i)]
  end
end

# Whether every statement about one key reads through the unique index, in the plan kept once prepared and in
# the plan for these values: [true or false, the plans that do not].
def index_lookups(done)
  kit = claims
  token = SecureRandom.uuid
  statements = { claim: [done, "fingerprint"], read: [done], complete: [done, token],
                 release: [done, token, "why"], settle: [done, token, "held", "why"],
                 take_over: [done, token, "why"] }
  wrong = statements.flat_map do |name, values|
    [true, false].filter_map do |generic|
      plan = kit.plan(name, *values, generic: generic)
      read = plan[/Seq Scan on \w+|Index (?:Only )?Scan using \w+/]
      "#{name}#{' (the plan kept)' if generic}: #{read}" unless
        plan.include?("#{TABLE}_operation") && !plan.match?(/Seq Scan|#{TABLE}_claimed/)
    end
  end
  [wrong.empty?, wrong]
end

# A figure against the same with no backlog, each first divided by the single-row commit timed beside it: the
# machine's commits get slower or faster from minute to minute (other work, the disk), the plans do not.
def against(figures, base, name)
  (figures.fetch(name) / figures.fetch("one commit")) / (base.fetch(name) / base.fetch("one commit"))
end

def print_timings(title, figures, base = nil)
  puts "   #{title}"
  figures.each do |name, seconds|
    line = "     #{name.ljust(10)} #{Measure.micro(seconds)}"
    line += "  x#{format('%.2f', seconds / base.fetch(name))}" if base
    line += ", x#{format('%.2f', against(figures, base, name))} in commits" if base && GUARDED.include?(name)
    puts line
  end
end

def verdicts(title, figures, base)
  GUARDED.each do |name|
    puts "   #{title}, #{name}: #{Measure.verdict(against(figures, base, name), 1.2)}"
  end
end

# 3. Stale claims older than the lease, drained by the kit's sweeper (with the hold policy).
def sweeper(count)
  fill("#{PREFIX}stale-", count, "claimed",
       claimed_at: "clock_timestamp() - make_interval(secs => #{ {{- mod }}::LEASE_SECONDS} + 60 + n)")
  {{ mod }}.instance_variable_set(:@claims, claims("hold"))
  began = Measure.now
  handled = {{ mod }}::StaleClaimSweeperJob.sweep
  seconds = Measure.now - began
  held = value("SELECT COUNT(*) FROM #{TABLE} WHERE operation_key LIKE '#{PREFIX}stale-%' AND status = 'held'").to_i
  batch = {{ mod }}::StaleClaimSweeperJob::BATCH
  puts "3. the sweeper, #{count} stale claims under hold (batches of #{batch})"
  puts "   #{handled} handled in one sweep, #{held} held, in #{format('%.1f', seconds)} s " \
       "(#{format('%.0f', count / seconds)} a second)"
  puts "   #{format('%.1f', seconds)} s (goal <= 30 s): #{seconds <= 30 && held == count ? 'PASS' : 'MISS'}"
  puts
end

def retention(days)
  before = sizes
  began = Measure.now
  deleted = claims.retain(days: days, job: {{ mod }}::{{ job }})
  seconds = Measure.now - began
  sql("VACUUM #{TABLE}")
  after = sizes
  puts "4. retention: `rake {{ c.project_slug }}:retain DAYS=#{days}` deleted #{deleted} " \
       "completed records in #{format('%.1f', seconds)} s"
  print_sizes("before", before)
  print_sizes("after, and VACUUM", after)
  puts "   (VACUUM makes the space of deleted rows reusable by new ones; the files keep their size)"
end

# 1 and 2: the guarded updates and the plans, with no backlog, then a backlog under the statistics taken before
# it, then fresh ones.
def backlog(samples, done)
  timings("warm", 20, done)
  phases = { "no backlog" => [timings("none", samples, done), index_lookups(done), pages("none")] }
  fill("#{PREFIX}backlog-", OPTIONS[:backlog], "claimed")
  settle_disk
  phases["backlog, statistics from before it"] = [timings("kept", samples, done), index_lookups(done), pages("kept")]
  sql("ANALYZE #{TABLE}")
  phases["backlog, fresh statistics"] = [timings("fresh", samples, done), index_lookups(done), pages("fresh")]
  report_backlog(samples, phases)
end

def report_backlog(samples, phases)
  none, = phases.fetch("no backlog")
  puts "1. the guarded updates and a duplicate with #{OPTIONS[:backlog]} claims or none, median of #{samples} each; " \
       "the goal compares each with no backlog in single-row commits timed beside it"
  phases.each { |title, (figures, _)| print_timings(title, figures, figures.equal?(none) ? nil : none) }
  phases.drop(1).each { |title, (figures, _)| verdicts(title, figures, none) }
  puts
  puts "2. statements about one key, the duplicate's among them, read through the unique index (EXPLAIN)"
  phases.each { |title, (_, (ok, wrong))| puts "   #{title}: #{ok ? 'PASS' : "MISS: #{wrong.join('; ')}"}" }
  report_pages(phases)
  puts
end

def report_pages(phases)
  puts "   pages each guarded update touches (EXPLAIN ANALYZE, BUFFERS; rolled back), whatever the machine's load:"
  phases.each do |title, (_, _, touched)|
    puts "     #{title}: #{touched.map { |name, count| "#{name} #{count}" }.join(', ')}"
  end
end

def fill_completed
  began = Measure.now
  fill("#{PREFIX}done-", OPTIONS[:rows], "completed")
  sql("VACUUM ANALYZE #{TABLE}") # the statistics at scale: nothing claimed
  settle_disk
  puts "filled #{OPTIONS[:rows]} completed records in #{format('%.1f', Measure.now - began)} s"
  print_sizes("sizes", sizes)
  puts
end

def refuse_unless_empty
  Sidekiq.logger.reopen(File.join(Dir.tmpdir, "bench-#{Measure::RUN}.log"))
  Sidekiq.logger.level = :warn # 100,000s of claims would write as many lines
  existing = value("SELECT COUNT(*) FROM #{TABLE}").to_i
  return if existing.zero?

  abort "the scale benchmark fills #{TABLE} and empties it after: it has #{existing} records, so point " \
        "DATABASE_URL at an empty test database"
end

Measure.connect!
refuse_unless_empty
RAW = Measure.raw
Measure.header("The claim at scale: #{OPTIONS[:rows]} completed records, a backlog of #{OPTIONS[:backlog]} claims",
               RAW)
sql("ALTER TABLE #{TABLE} SET (autovacuum_enabled = false)")
RAW.exec("CREATE TABLE #{SCRATCH} (id integer PRIMARY KEY, n integer NOT NULL); INSERT INTO #{SCRATCH} VALUES (1, 0)")
RAW.prepare("one_commit", "UPDATE #{SCRATCH} SET n = n + 1 WHERE id = 1")
begin
  fill_completed
  claims.complete(claims.claim("#{PREFIX}done", "fingerprint"))
  backlog(OPTIONS[:samples], "#{PREFIX}done")
  sweeper(OPTIONS[:stale])
  retention(OPTIONS[:days])
  puts "#{Measure.load} at the end"
ensure
  sql("TRUNCATE #{TABLE}") # it was empty
  sql("ALTER TABLE #{TABLE} RESET (autovacuum_enabled)")
  RAW.exec("DROP TABLE IF EXISTS #{SCRATCH}")
  RAW.close
end
