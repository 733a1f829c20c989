{%- from "replay_matrix.jinja" import rb -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

require "rbconfig"
require "timeout"
require "uri"

# A worker refuses to start on a database it cannot use, with one line saying what to do: the record table
# missing, not migrated to its latest revision, or a login that fails. Live, a real `sidekiq` process (its
# startup needs Redis); embedded, the same check that Sidekiq's startup runs, in a Ruby process of its own.
# Left out inside a host app (REPLAY_HOST_APP): the app's worker boots the app, and its database is the app's.
RSpec.describe "a worker of {{ c.job_type }} on a database it cannot use", unless: HOST_APP do
  let(:kit_dir) { File.join(__dir__, "..") }

  # The worker's exit status and what it wrote to standard error, on the database at `url`. One that does not
  # stop within 30 s is stopped, and fails the example.
  def start_worker(url)
    kit_file = "./lib/{{ c.project_slug }}.rb"
    command = if LIVE
                [Gem.bin_path("sidekiq", "sidekiq"), "-r", kit_file, "-q", "startup-check"]
              else
                check = "{{ mod }}::DatabaseCheck.refuse_to_start_unless_usable"
                ["-r", "./lib/{{ c.project_slug }}.rb", "-e", check]
              end
    err = File.join(WORK_DIR, "startup.err")
    pid = Process.spawn({ "DATABASE_URL" => url }, RbConfig.ruby, *command, chdir: kit_dir, err: err,
                                                                            out: File::NULL)
    status = Timeout.timeout(30) { Process.wait2(pid).last }
    [status.exitstatus, File.read(err)]
  rescue Timeout::Error
    Process.kill(:TERM, pid)
    Process.wait(pid)
    raise "the worker started on #{url}"
  end

  # A SQLite file with schema.sql as it was at the second revision (no queued or failed; no index of queued rows;
  # no resolutions) or at the third (no resolutions).
  def at_revision(revision)
    # here, not at the top: an app's bundle (REPLAY_HOST_APP, where these examples are left out) may have no sqlite3
    require "sqlite3"
    path = File.join(WORK_DIR, "revision-#{revision}.sqlite3")
    sql = File.read(File.join(kit_dir, "schema.sql")).gsub(/--.*$/, "").split(";").map(&:strip).reject(&:empty?)
    sql = sql.reject { |statement| statement.include?("_resolutions") }
    SQLite3::Database.new(path) do |db|
      sql.each do |statement|
        next db.execute(statement) if revision == 3
        next if statement.include?("_queued")

        db.execute(statement.sub("'queued', ", "").sub("'failed', ", ""))
      end
    end
    "sqlite3:#{path}"
  end

  it "refuses an empty database: the record table does not exist" do
    code, err = start_worker("sqlite3:#{File.join(WORK_DIR, 'empty.sqlite3')}")

    expect(code).not_to eq(0)
    expect(err.lines).to eq(["replay-matrix: {{ c.record_table }} does not exist in the database; run " \
                             "`bundle exec rake {{ c.project_slug }}:migrate`, " \
                             "then start the worker again\n"])
  end

  it "refuses a database at the second revision, whose CHECK has no place for queued records" do
    code, err = start_worker(at_revision(2))

    expect(code).not_to eq(0)
    expect(err.lines.size).to eq(1)
    expect(err).to start_with("replay-matrix: {{ c.record_table }} is not migrated to revision 3")
  end

  it "refuses a database at the third revision, which keeps no resolutions" do
    code, err = start_worker(at_revision(3))

    expect(code).not_to eq(0)
    expect(err.lines).to eq(["replay-matrix: {{ c.record_table }} is not migrated to revision 4 " \
                             "(no {{ c.record_table }}_resolutions); run " \
                             "`bundle exec rake {{ c.project_slug }}:migrate`, " \
                             "then start the worker again\n"])
  end

  # A worker that started on a good database may lose it: Sidekiq retries the message, and the job says at ERROR,
  # each time, what a person must do about an error that will not pass by itself.
  it "says what a person must do about database errors that will not pass by themselves, and nothing of others" do
    table = "{{ c.record_table }}"
    {
      "PG::UndefinedTable: ERROR:  relation \"#{table}\" does not exist" => /does not exist: run `.*migrate`\z/,
      "SQLite3::SQLException: no such table: #{table}" => /no such table: #{table}: run `.*migrate`\z/,
      "PG::InsufficientPrivilege: ERROR:  permission denied for table #{table}" =>
        /permission denied for table #{table}: grant DATABASE_URL's role the rights on #{table}\z/,
      "PG::ConnectionBad: connection to server failed: FATAL:  password authentication failed for user \"x\"" =>
        /password authentication failed for user "x": check DATABASE_URL and its credentials\z/,
      "PG::ConnectionBad: connection to server failed: Connection refused" => nil,
      "PG::ConnectionBad: server closed the connection unexpectedly" => nil
    }.each do |message, line|
      needed = {{ mod }}::DatabaseCheck.person_needed(ActiveRecord::StatementInvalid.new(message))
      line ? expect(needed).to(match(line)) : expect(needed).to(be_nil)
    end
  end

  # Embedded only: live, faults_spec.rb takes the table away from a running worker, and retries the job once it is
  # back.
  it "logs at ERROR, at each delivery, that the record table is missing, and raises so that Sidekiq retries",
     unless: LIVE do
    table = "{{ c.record_table }}"
    connection = ActiveRecord::Base.connection
    connection.execute("ALTER TABLE #{table} RENAME TO #{table}_away")
    begin
      outcomes, log = logged { Array.new(2) { queue.deliver_raw([{{ rb(c.example_key) }}]) } }
    ensure
      connection.execute("ALTER TABLE #{table}_away RENAME TO #{table}")
    end

    expect(outcomes).to eq(%w[raised raised])
    # (Sidekiq 8's log lines start with the level, earlier ones with the time)
    said = /ERROR.* {{ c.job_type }} .*: no such table: #{table}: run `.*migrate`; Sidekiq retries/
    expect(log.scan(said).size).to eq(2)
  end

  # Live only (left out, not pending, when embedded: there is no PostgreSQL to log in to).
  it "refuses a login that fails, naming DATABASE_URL", if: LIVE do
    url = URI(ENV.fetch("DATABASE_URL")).tap do |uri|
      uri.user = "no_such_role_{{ c.project_slug }}"
      uri.password = nil
    end.to_s

    code, err = start_worker(url)

    expect(code).not_to eq(0)
    expect(err.lines.size).to eq(1)
    expect(err).to match(/\Areplay-matrix: cannot connect or log in to the database \(.*\): check DATABASE_URL/)
  end
end
