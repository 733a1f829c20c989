{%- from "replay_matrix.jinja" import kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

# The kit's own PostgreSQL connection, one per thread, live only (SQLite has no server): kept across
# statements, replaced once the server has closed it, never shared with a forked child, and leaving the server
# session as it found it when the app prepares no statements (PgBouncer in transaction mode). The server really
# closes it (pg_terminate_backend); nothing is mocked. Cuts by the network are faults_spec.rb's.
{%- if kind.one_transaction %} Inside the job's
# transaction, the statements run on the app's own connection instead: prepared there too, its settings kept.
{%- endif %}
return unless LIVE

RSpec.describe "the kit's own connection" do
  let(:claims) { {{ mod }}.claims }
  let(:session) { {{ mod }}::Claims::Session }

  def backend_alive?(pid)
    ActiveRecord::Base.connection.select_value("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = #{pid}").to_i == 1
  end

  it "keeps one connection per thread across statements, and another thread has its own" do
    claims.claim("CONN-1", "fingerprint")
    mine = session.current.backend_pid
    claims.read("CONN-1")
    claims.claim("CONN-2", "fingerprint")

    expect(session.current.backend_pid).to eq(mine)
    expect(Thread.new { claims.read("CONN-1") && session.current.backend_pid }.value).not_to eq(mine)
  end

  it "opens another connection for the next statement once the server has closed this one" do
    claims.claim("CONN-1", "fingerprint")
    closed = session.current.backend_pid
    ActiveRecord::Base.connection.execute("SELECT pg_terminate_backend(#{closed})")
    sleep 0.01 while backend_alive?(closed)

    claim = claims.claim("CONN-2", "fingerprint")

    expect(claim).not_to be_nil
    expect(claims.read("CONN-2")["status"]).to eq("claimed")
    expect(session.current.backend_pid).not_to eq(closed)
  end

  it "prepares nothing and sets nothing on its session with prepared_statements: false (PgBouncer, transactions)" do
    config = ActiveRecord::Base.connection_db_config.configuration_hash.merge(prepared_statements: false)
    pool = Struct.new(:db_config).new(ActiveRecord::DatabaseConfigurations::HashConfig.new("test", "bouncer", config))
    bouncer = session.new(pool)
    claims.claim("CONN-1", "fingerprint")
    expect(bouncer.run(:read, claims.sql(:read), ["CONN-1"], true).first["status"]).to eq("claimed")

    setting = "SHOW enable_seqscan"
    expect(bouncer.connection.exec("SELECT COUNT(*) FROM pg_prepared_statements").getvalue(0, 0)).to eq("0")
    expect(bouncer.connection.exec(setting).getvalue(0, 0)).to eq(ActiveRecord::Base.connection.select_value(setting))
    expect(session.current.connection.exec(setting).getvalue(0, 0)).to eq("off") # the usual connection's own
  ensure
    bouncer&.discard
  end

  it "leaves the parent's connection alone in a forked child, which opens its own" do
    claims.claim("CONN-1", "fingerprint")
    parent = session.current.backend_pid
    reader, writer = IO.pipe
    child = fork do
      reader.close
      claims.claim("CONN-2", "fingerprint")
      writer.puts(session.current.backend_pid)
      exit!(0) # not the parent's at_exit hooks
    rescue StandardError => e
      writer.puts(e.full_message)
      exit!(1)
    end
    writer.close
    said = reader.read
    expect(Process.wait2(child).last).to be_success, said

    expect(said.to_i).not_to eq(parent)
    expect(claims.read("CONN-2")["status"]).to eq("claimed")
    expect(session.current.backend_pid).to eq(parent) # still open, still this thread's
  end
end
{%- if kind.one_transaction %}

RSpec.describe "the kit's statements inside the job's transaction, on the app's connection" do
  let(:job) { {{ mod }}::{{ c.job_type.split("_")|map("capitalize")|join }}Job.new }
  let(:claims) { {{ mod }}.claims }
  let(:connection) { ActiveRecord::Base.connection }

  it "are prepared there once, and leave the app's settings as they were" do
    setting = connection.select_value("SHOW enable_seqscan")
    job.perform("GUEST-1")
    job.perform("GUEST-2")

    prepared = connection.select_values(
      "SELECT name FROM pg_prepared_statements WHERE name LIKE '{{ c.project_slug }}%'"
    )
    expect(prepared).to contain_exactly(a_string_starting_with("{{ c.project_slug }}_claim_"),
                                        a_string_starting_with("{{ c.project_slug }}_complete_"))
    expect(connection.select_value("SHOW enable_seqscan")).to eq(setting)
    expect([record("GUEST-1"), record("GUEST-2"), effects.count]).to eq(["completed", "completed", 2])
  end

  it "fail one attempt after the app resets its connection (DISCARD ALL); the retry prepares them and performs once" do
    job.perform("GUEST-1")
    connection.reset!

    expect { job.perform("GUEST-2") }.to raise_error(ActiveRecord::StatementInvalid, /prepared statement/)
    expect([record("GUEST-2"), effects.count]).to eq(["none", 1])
    job.perform("GUEST-2")
    expect([record("GUEST-2"), effects.count]).to eq(["completed", 2])
  end
end
{%- endif %}
