{%- from "replay_matrix.jinja" import kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set t = c.record_table -%}
# frozen_string_literal: true

# The plans the database chooses for the kit's statements, read with EXPLAIN: every statement about one key goes
# through the unique (job_type, operation_key) index whatever the statistics say (taken while nothing was
# claimed, as they are at scale, or fresh, or taken on an empty table), and only the sweeper's question reads the
# partial index of claimed rows. A plan that walked the claimed rows would make completion slow down with the
# backlog; a plan that scanned the table would make duplicates slow down with the table.
RSpec.describe "the plans of the kit's statements" do
  let(:claims) { {{ mod }}.claims }
  let(:connection) { ActiveRecord::Base.connection }
  let(:postgresql) { connection.adapter_name == "PostgreSQL" }
  let(:key) { "PLAN-0000001" }
  let(:token) { "00000000-0000-0000-0000-000000000000" }

  # Each statement about one key, with values of the right kinds.
  let(:by_key) do
    {
      claim: [key, "fingerprint"], read: [key], complete: [key, token], release: [key, token, "why"],
      take_over: [key, token, "why"], settle: [key, token, "held", "why"],
      resolve: [key, "completed", 1, "alice", "why"], enqueue: [key, "fingerprint", "{}"],
      claim_queued: [key, token], details: [key], fail: [key, "why"], resent: [key, token, 600]
    }
  end

  # `count` records of that status, written as the kit writes them.
  def fill(status, count, prefix)
    now = postgresql ? "clock_timestamp()" : "julianday('now')"
    series = if postgresql
               "generate_series(1, #{count}) AS n(i)"
             else
               "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < #{count}) SELECT i FROM n)"
             end
    connection.execute(<<~SQL)
      INSERT INTO {{ t }} (job_type, operation_key, payload_fingerprint, status, claim_token, claimed_at, completed_at)
      SELECT '{{ c.job_type }}', '#{prefix}-' || i, 'fingerprint', '#{status}', 'token', #{now},
             #{status == 'completed' ? now : 'NULL'}
      FROM #{series}
    SQL
  end

  def analyze
    connection.execute("ANALYZE {{ t }}")
  end

  # The plans of every statement about one key: on PostgreSQL the one kept once the prepared statement stops
  # planning each run, and the one for these values.
  def key_plans
    by_key.flat_map do |name, values|
      next [[name, claims.plan(name, *values)]] unless postgresql

      [[name, claims.plan(name, *values, generic: true)], [name, claims.plan(name, *values)]]
    end
  end

  def expect_unique_index(plans)
    # a scan of the table, or a walk of the partial indexes' rows
    elsewhere = /Seq Scan|SCAN {{ t }}\b|{{ t }}_(claimed|queued)/
    plans.each do |name, plan|
      expect(plan).to include("{{ t }}_operation"), "#{name}:\n#{plan}"
      expect(plan).not_to match(elsewhere), "#{name}:\n#{plan}"
    end
  end

  before do
    # SQLite's plan of an INSERT shows no index: its claim is the insert alone, and the read after it is checked.
    by_key.delete(:claim) unless postgresql
    by_key.delete(:enqueue) unless postgresql
  end

  it "finds one key through the unique index with statistics taken while nothing was claimed, and fresh ones" do
    fill("completed", 5000, "DONE")
    analyze # what the statistics say at scale: nothing claimed
    fill("claimed", 2000, "BACKLOG")

    expect_unique_index(key_plans)
    analyze # fresh: a backlog of claims
    expect_unique_index(key_plans)
  end

  it "answers the sweeper's question through the partial index of claimed rows" do
    fill("completed", 5000, "DONE")
    fill("claimed", 200, "BACKLOG")
    analyze

    plan = claims.plan(:stale, 100)
    expect(plan).to include("{{ t }}_claimed")
    expect(plan).not_to match(/Seq Scan|SCAN {{ t }}\b/)
  end

  it "answers the sweeper's other question, what stays queued past the re-send time, through the queued rows" do
    fill("completed", 5000, "DONE")
    fill("claimed", 200, "BACKLOG")
    fill("queued", 200, "SENT")
    analyze

    plan = claims.plan(:queued_due, 100, 600)
    expect(plan).to include("{{ t }}_queued")
    expect(plan).not_to match(/Seq Scan|SCAN {{ t }}\b/)
  end

  it "keeps duplicates on the unique index after ANALYZE on an empty table, once the table has grown" do
    # The statistics of an empty table: one that never held a row (DELETE would leave its pages behind).
    connection.execute("TRUNCATE {{ t }}") if postgresql
    analyze
    fingerprint = "fingerprint"
    # Enough runs of the same statements for PostgreSQL to settle on one plan for each and keep it.
    10.times { claims.claim(key, fingerprint) }
    10.times { claims.read(key) }
    fill("completed", 5000, "DONE")

    expect_unique_index(key_plans)
  end
{%- if kind.one_transaction %}

  # The job's transaction is ActiveRecord's, on the app's connection, where the kit's statements are prepared too
  # (Claims::Guest) but the app's settings rule: the kit's first statement in a transaction turns sequential scans
  # off for the rest of it (the completion, sent without the setting, runs under it).
  if LIVE
    it "keeps claims, completions and duplicates on the unique index inside the job's transaction, too" do
      connection.execute("TRUNCATE {{ t }}")
      analyze
      # Planned while the table holds a few rows, in the job's transaction: a scan would be the cheapest plan.
      10.times { connection.transaction { claims.claim(key, "fingerprint") } }
      10.times { |i| {{ mod }}::{{ c.job_type.split("_")|map("capitalize")|join }}Job.new.perform("#{key}-small-#{i}") }
      connection.execute("UPDATE {{ t }} SET status = 'completed'")
      fill("completed", 5000, "DONE")
      prepared = connection.select_values("SELECT name FROM pg_prepared_statements")

      in_this_transaction = "SELECT seq_scan FROM pg_stat_xact_user_tables " \
                            "WHERE relname = '{{ t }}'"
      scans = -> { connection.select_value(in_this_transaction).to_i }
      connection.transaction do
        before = scans.call
        # The jobs join this transaction, whose counters show every scan of the table so far: duplicates, then new
        # keys (claimed, the effect's row written, completed).
        3.times { {{ mod }}::{{ c.job_type.split("_")|map("capitalize")|join }}Job.new.perform(key) }
        3.times { |i| {{ mod }}::{{ c.job_type.split("_")|map("capitalize")|join }}Job.new.perform("#{key}-new-#{i}") }
        expect(claims.read("#{key}-new-2")["status"]).to eq("completed")
        expect(scans.call).to eq(before)
        raise ActiveRecord::Rollback
      end
      expect(prepared).to include(a_string_starting_with("{{ c.project_slug }}_claim_"))
    end
  end
{%- endif %}
end
