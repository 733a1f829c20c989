{%- from "replay_matrix.jinja" import kind with context -%}
{%- set c = cookiecutter -%}
# frozen_string_literal: true

# A second connection, for the tables of schema.sql, so that the suite's own stays as it is.
class SchemaSqlProbe < ActiveRecord::Base
  self.abstract_class = true
end

# The suite's tables come from the migration in db/migrate; schema.sql is the same tables in plain SQL. This
# builds schema.sql beside them (another SQLite file, or another PostgreSQL schema) and compares the two.
RSpec.describe "the migration and schema.sql" do
  tables = %w[{{ c.record_table }} {{ c.record_table }}_resolutions]
{%- if kind.one_transaction %}
  tables << "{{ c.job_type }}_effects"
{%- endif %}

  let(:probe) { SchemaSqlProbe }
  let(:postgresql) { ActiveRecord::Base.connection.adapter_name == "PostgreSQL" }

  def statements
    File.read(File.join(__dir__, "..", "schema.sql")).gsub(/--.*$/, "").split(";").map(&:strip).reject(&:empty?)
  end

  def shape(connection, table)
    {
      columns: connection.columns(table).map { |col| [col.name, col.sql_type.downcase, col.null, col.default] },
      indexes: indexes(connection, table).sort,
      checks: checks(connection, table)
    }
  end

  # [name, expression] of the CHECK constraints. On PostgreSQL asked by the table's regclass, which follows
  # the search path (ActiveRecord 6.1's check_constraints mixes tables of the same name in other schemas).
  def checks(connection, table)
    return connection.check_constraints(table).map { |check| [check.name, check.expression.squish] } unless postgresql

    connection.exec_query(<<~SQL).map { |check| [check["name"], check["expression"]] }
      SELECT conname AS name, pg_get_constraintdef(oid) AS expression FROM pg_constraint
      WHERE contype = 'c' AND conrelid = '#{table}'::regclass ORDER BY conname
    SQL
  end

  # [columns, unique, predicate] of every index, those behind a UNIQUE constraint included (SQLite names them
  # itself); the predicate of a partial index as the database keeps it, else nil.
  def indexes(connection, table)
    return connection.indexes(table).map { |index| [index.columns, index.unique, index.where] } if postgresql

    connection.exec_query("PRAGMA index_list(#{table})").map do |index|
      columns = connection.exec_query("PRAGMA index_info(#{index['name']})").sort_by { |col| col["seqno"] }
      [columns.map { |col| col["name"] }, index["unique"] == 1, sqlite_predicate(connection, index["name"])]
    end
  end

  def sqlite_predicate(connection, index)
    sql = connection.select_value("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = '#{index}'")
    sql&.[](/\sWHERE\s+(.+)\z/im, 1)&.squish
  end

  # The migration context of the suite's database (ActiveRecord 7.2 moved it from the connection to the pool).
  def migration_context
    pool = ActiveRecord::Base.connection_pool
    pool.respond_to?(:migration_context) ? pool.migration_context : ActiveRecord::Base.connection.migration_context
  end

  def index_names(table)
    ActiveRecord::Base.connection.indexes(table).map(&:name).sort
  end

  def with_schema_sql
    if postgresql
      config = ActiveRecord::Base.connection_db_config.configuration_hash.merge(schema_search_path: "schema_sql")
      probe.establish_connection(config)
      probe.connection.execute("DROP SCHEMA IF EXISTS schema_sql CASCADE")
      probe.connection.execute("CREATE SCHEMA schema_sql")
    else
      probe.establish_connection(adapter: "sqlite3", database: File.join(WORK_DIR, "schema_sql.sqlite3"))
    end
    statements.each { |statement| probe.connection.execute(statement) }
    yield probe.connection
  ensure
    probe.connection.execute("DROP SCHEMA IF EXISTS schema_sql CASCADE") if postgresql
    probe.remove_connection
  end

  it "create the same tables: columns, types, nulls, defaults, indexes, unique keys and checks" do
    from_migration = tables.to_h { |table| [table, shape(ActiveRecord::Base.connection, table)] }
    from_schema_sql = with_schema_sql { |connection| tables.to_h { |table| [table, shape(connection, table)] } }

    expect(from_migration).to eq(from_schema_sql)
    expect(from_migration["{{ c.record_table }}"][:indexes].map { |index| index.first(2) })
      .to contain_exactly([%w[job_type operation_key], true], [%w[claimed_at], false], [%w[claimed_at], false])
    expect(from_migration["{{ c.record_table }}"][:indexes].map(&:last).compact.sort)
      .to match([/status.*=.*'claimed'/, /status.*=.*'queued'/])
  end

  def insert(key, status)
    ActiveRecord::Base.connection.execute(<<~SQL)
      INSERT INTO {{ c.record_table }} (job_type, operation_key, payload_fingerprint, status, claim_token, claimed_at)
      VALUES ('{{ c.job_type }}', #{ActiveRecord::Base.connection.quote(key)}, 'f', '#{status}', 't', CURRENT_TIMESTAMP)
    SQL
  end

  # An app that applied the first revision gets the later ones on its next migrate; and they roll back.
  # Left out inside a host app (REPLAY_HOST_APP), whose own db:migrate made the tables; so is the next.
  it "replaces the first revision's index of every row with the partial index of claimed rows, and back",
     unless: HOST_APP do
    first, second, *later = migration_context.migrations.map(&:version).sort
    insert("KEPT", "completed")

    migration_context.down(first)
    expect(index_names("{{ c.record_table }}")).to include("{{ c.record_table }}_by_status")
    expect(index_names("{{ c.record_table }}")).not_to include("{{ c.record_table }}_claimed")
    expect(index_names("{{ c.record_table }}")).not_to include("{{ c.record_table }}_queued")
    migration_context.up(second)
    expect(index_names("{{ c.record_table }}")).to include("{{ c.record_table }}_claimed")
    expect(index_names("{{ c.record_table }}")).not_to include("{{ c.record_table }}_by_status")
    migration_context.up(later.last)
    records = ActiveRecord::Base.connection.select_value("SELECT COUNT(*) FROM {{ c.record_table }}")
    expect(records.to_i).to eq(1)
  end

  # The third revision admits queued and failed records and indexes the queued ones; rolled back, the CHECK of the
  # second refuses them again (and the worker's start refuses such a database: DatabaseCheck).
  it "admits queued and failed records from the third revision on, and back", unless: HOST_APP do
    _, second, third, fourth = migration_context.migrations.map(&:version).sort
    insert("KEPT", "completed")

    migration_context.down(second)
    expect(index_names("{{ c.record_table }}")).not_to include("{{ c.record_table }}_queued")
    expect { insert("QUEUED", "queued") }.to raise_error(ActiveRecord::StatementInvalid, /check/i)
    expect({{ c.project_slug.split("_")|map("capitalize")|join }}::DatabaseCheck.problem).to match(/not migrated to revision 3.*run `/)
    migration_context.up(third)
    expect(index_names("{{ c.record_table }}")).to include("{{ c.record_table }}_claimed")
    expect(index_names("{{ c.record_table }}")).to include("{{ c.record_table }}_queued")
    insert("QUEUED", "queued")
    insert("FAILED", "failed")
    records = ActiveRecord::Base.connection.select_value("SELECT COUNT(*) FROM {{ c.record_table }}")
    expect(records.to_i).to eq(3)
    expect({{ c.project_slug.split("_")|map("capitalize")|join }}::DatabaseCheck.problem).to match(/not migrated to revision 4 .*run `/)
    migration_context.up(fourth)
    expect({{ c.project_slug.split("_")|map("capitalize")|join }}::DatabaseCheck.problem).to be_nil
  end

  # The fourth revision keeps every resolution; rolled back, its table goes and the records stay.
  it "keeps resolutions from the fourth revision on, and back", unless: HOST_APP do
    third, fourth = migration_context.migrations.map(&:version).sort.last(2)
    insert("KEPT", "completed")

    migration_context.down(third)
    expect(ActiveRecord::Base.connection.table_exists?("{{ c.record_table }}_resolutions")).to be(false)
    expect({{ c.project_slug.split("_")|map("capitalize")|join }}::DatabaseCheck.problem).to match(/not migrated to revision 4 .*run `/)
    migration_context.up(fourth)
    expect(ActiveRecord::Base.connection.table_exists?("{{ c.record_table }}_resolutions")).to be(true)
    records = ActiveRecord::Base.connection.select_value("SELECT COUNT(*) FROM {{ c.record_table }}")
    expect(records.to_i).to eq(1)
  end
end
