{%- from "replay_matrix.jinja" import kind, policies with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

# loaded now: their lazy load on first use is not thread-safe (ruby/digest#57)
require "digest/md5"
require "digest/sha2"
require "json"

module {{ mod }}
  # The claim runtime: the record of handled operations in `{{ c.record_table }}`, and every change to it.
  #
  #   enqueue:   INSERT ... 'queued' ON CONFLICT DO NOTHING   the app's send: the record before the message
  #   claim:     INSERT ... ON CONFLICT DO NOTHING RETURNING  a row back: this run owns the work (a queued
  #                                                           record: UPDATE ... WHERE claim_token = the one seen)
  #   complete:  UPDATE ... WHERE claim_token = ours          only the run holding the claim completes it
  #   take over: UPDATE ... WHERE claim_token = the one seen  a compare-and-swap that one run alone can win
  #
  # The database draws each claim's token (random, returned by the statement that claims), so that a duplicate costs
  # no draw. The database is the only clock: timestamps are written in SQL (PostgreSQL clock_timestamp(), which moves
  # within a transaction, unlike now(); SQLite julianday('now'), in fractions of a day) and "older than the lease" is
  # decided in SQL, never by a worker's clock. Outside a transaction each statement commits on its own, so a claim is
  # committed before the effect starts. Every skip, hold, takeover and conflict is logged with the job type and the
  # key.
  #
  # Where the statements run: on PostgreSQL, each prepared once, on the thread's own connection (Session, below)
{%- if kind.one_transaction %}
  # or, inside the job's transaction, on that transaction's ActiveRecord connection, where the effect writes its
  # row too (Guest, below);
{%- else %}
  # (so a claim commits before the effect even when the job runs inside a transaction of the app's);
{%- endif %}
  # on SQLite, through ActiveRecord, on a connection checked out for the one statement.
  class Claims
    # What the kit's connections share: its statements prepared on a PG::Connection (@connection), once each, and
    # the plans PostgreSQL keeps for them.
    module Prepared
      # The statement's name on this connection, prepared on first use. Named after the SQL itself, so that two
      # Claims with other settings never share a name for other SQL.
      def prepared(name, text)
        @prepared[text] ||= "{{ c.project_slug }}_#{name}_#{Digest::MD5.hexdigest(text)[0, 8]}"
                            .tap { |statement| @connection.prepare(statement, text) }
      end

      # EXPLAIN of the prepared statement (see Claims#plan), in the transaction that `around` opens and undoes.
      def explain(statement, values, generic:, run:, around:)
        params = values.map { |value| @connection.escape_literal(value.to_s) }.join(", ")
        @connection.exec(around.first)
        @connection.exec("SET LOCAL plan_cache_mode = #{generic ? 'force_generic_plan' : 'force_custom_plan'}")
        @connection.exec("EXPLAIN #{'(ANALYZE, BUFFERS) ' if run}EXECUTE #{statement}(#{params})")
                   .column_values(0).join("\n")
      ensure
        @connection.exec(around.last) if @connection.transaction_status != PG::PQTRANS_IDLE
      end

      # ActiveRecord's error for a PG::Error, as the app's other statements raise it.
      def active_record_error(error)
        message = "#{error.class}: #{error.message}"
        return ActiveRecord::StatementInvalid.new(message) if @connection.status == PG::CONNECTION_OK

        # ActiveRecord 7 says ConnectionFailed (a StatementInvalid); 6.1 has only StatementInvalid.
        lost = ActiveRecord.const_defined?(:ConnectionFailed) ? :ConnectionFailed : :StatementInvalid
        ActiveRecord.const_get(lost).new(message)
      end
    end

    # The key is known with another payload: a different operation reusing the key, not a duplicate.
    class PayloadConflict < StandardError; end

    # A claim this run holds. taken_over: it replaces a run that may have performed the effect already.
    Claim = Struct.new(:key, :token, :attempt, :taken_over, keyword_init: true)

    # What a person sees of an operation that waits for them: held, or failed past Sidekiq's retries.
    HeldOperation = Struct.new(:key, :status, :attempt, :claimed_at, :note, keyword_init: true)

    # A record's life outside one run's claim: the app's send, Sidekiq giving up, the sweeper's re-send, a
    # person's list and decision, the status a monitor reads.
    module Lifecycle
      # The app's send: writes the key's record as queued (attempt 0, claimed_at now, a new token) with its payload,
      # where no record is. True when this wrote it, false when the key was known already (nothing written).
      # Raises PayloadConflict when the key is known with another payload. Through ActiveRecord, so that inside the
      # app's transaction the record commits or rolls back with the app's data.
      def enqueue(key, fingerprint, payload)
        return true if run(:enqueue, [key, fingerprint, payload], rows: false, own: false).positive?

        known = all(:read, key, own: false).first
        conflict!(key, "not sent") if known && known["payload_fingerprint"] != fingerprint
        false
      end

      # The details the key's record was sent with (by enqueue), or nil where it has none.
      def details(key)
        first(:details, key)&.fetch("payload")&.then { |payload| JSON.parse(payload) }
      end
{% if kind.one_transaction %}
      # Sidekiq gave up on the key's job: a record left queued (the effect's error rolled the claim back with the
      # transaction) or released becomes failed, with the last error, for a person to see and resolve. False when
      # the record is neither (completed meanwhile, or never recorded).
{%- else %}
      # Sidekiq gave up on the key's job: a record its failing effect left released becomes failed, with the last
      # error, for a person to see and resolve. False when the record is not released (completed meanwhile, or
      # never claimed).
{%- endif %}
      def fail(key, error)
        changed(:fail, key, "failed past Sidekiq's retries: #{error}").positive?.tap do |failed|
          next unless failed

          log(:error, key, "failed past Sidekiq's retries, waits for a person: #{error}", outcome: "failed")
          notify(key, "failed")
        end
      end

      # [key, details or nil] of records still queued `after` seconds after they were sent (the broker may have
      # lost the message), oldest first; each is marked sent again (claimed_at now) before it is returned, so that
      # the next sweep leaves it alone for as long again. A record claimed meanwhile is not returned.
      def resend_queued(after:, limit: 100)
        all(:queued_due, limit, after).filter_map do |row|
          next unless changed(:resent, row["operation_key"], row["claim_token"], after).positive?

          notify(row["operation_key"], "resent")
          [row["operation_key"], row["payload"] && JSON.parse(row["payload"])]
        end
      end

      # The operations that wait for a person: held, then failed, each oldest first.
      def held
        # Through ActiveRecord: a person's list reads every record of the job type, which the kit's own connection,
        # made for lookups by key, would do through the index.
        all(:held, own: false).map do |row|
          HeldOperation.new(key: row["key"], status: row["status"], attempt: row["attempt"].to_i,
                            claimed_at: row["claimed_at"], note: row["note"])
        end
      end

      # A person's decision on a held or failed operation: done (completed), or released for one more attempt
      # (queued again, with a new token and its attempt kept; the caller sends it). `by` is the name the person
      # gave, `resolved_as` who the system knows them as (the OS user of the task); the database adds its own role.
      # The record and its audit row change together, through ActiveRecord. nil when the key is neither held nor
      # failed; else a Hash of status_before, status_after, database_role and details (the stored details, nil
      # where the record has none).
      def resolve(key, done:, by:, why:, resolved_as:)
        after = done ? "completed" : "queued"
        {{ mod }}.connection_pool.with_connection do |connection|
          texts = statements(connection.pool.db_config.adapter)
          connection.transaction(requires_new: true) do
            audited = through(connection, texts.fetch(:audit), [key, after, by, why, resolved_as], true).first
            next unless audited

            row = through(connection, texts.fetch(:resolve), [key, after, done ? 1 : 0, by, why], true).first
            audited.merge("status_after" => after, "details" => row["payload"] && JSON.parse(row["payload"]))
          end
        end
      end

      # Every resolution by a person, of `key` or of every key (nil), oldest first, as Hashes.
      def resolutions(key = nil)
        all(:resolutions, key, own: false)
      end

      # Per state that has records: a Hash of count, oldest (its age in seconds) and overdue (how many sit past
      # their time: queued ones `resend_after` seconds after they were sent, claimed or released ones the lease).
      # Through ActiveRecord, as the held list: it counts every record of the job type.
      def status(resend_after:)
        all(:status, resend_after, own: false).to_h { |row| [row["status"], row] }
      end
    end
    include Lifecycle

    # What the claims say of an operation: to the app's metrics, and to the log.
    module Reports
      # What became of an operation, as an ActiveSupport::Notifications event that an app wires to its metrics:
      # "operation.replay_matrix", with job_type, operation_key and outcome (README.md, "Metrics").
      def notify(key, outcome)
        ActiveSupport::Notifications.instrument(
          "operation.replay_matrix", job_type: job_type, operation_key: key, outcome: outcome
        )
      end

      # One line, "<job type> <key>: <message>", that carries the key, the record's attempt (where the line knows
      # it) and the outcome it reports as fields of Sidekiq's log context too: its formatters write them
      # (key=value in the text, "ctx" in JSON).
      def log(level, key, message, outcome:, attempt: nil)
        fields = { operation_key: key, attempt: attempt, outcome: outcome }.compact
        Sidekiq::Context.with(fields) { @logger.public_send(level, "#{job_type} #{key}: #{message}") }
      end
    end
    include Reports

    # What each stale-claim policy makes of a claim older than the lease: the status it settles it at (nil: a new
    # run takes it over), and the note it leaves on the record. The Python kits write the same.
    AFTER_LEASE = {
{%- for name, rule in policies.items() %}
      "{{ name }}" => [{{ '"%s"'|format(rule.after_lease) if rule.after_lease != "completed" else "nil" }}, "{{ rule.stale_note }}"]{{ "," if not loop.last }}
{%- endfor %}
    }.freeze

    attr_reader :job_type, :table, :lease_seconds, :policy

    def initialize(job_type:, table:, lease_seconds:, policy:, logger:)
      @job_type = job_type
      @table = table
      @lease_seconds = lease_seconds
      @policy = policy
      @logger = logger
      @statements = {}
    end

    # A Claim when this run owns the work; nil when it must leave it alone (the reason is logged).
    # Raises PayloadConflict when the key is recorded with another payload.
    def claim(key, fingerprint)
      # On PostgreSQL the claim returns the record it met, so that a duplicate costs one statement.
      row = first(:claim, key, fingerprint) || first(:read, key)
      # The record was removed between the insert and this read: the queue's retry decides again.
      raise "#{job_type} #{key}: the record vanished while claiming; retry" unless row
      if row["mine"].to_i == 1
        return Claim.new(key: key, token: row["claim_token"], attempt: row["attempt"].to_i, taken_over: false)
      end

      decide(key, fingerprint, row)
    end

    # The record of a key as a Hash (status, claim_token, payload_fingerprint, attempt, stale), or nil.
    def read(key)
      row = first(:read, key)
      row && { "status" => row["status"], "claim_token" => row["claim_token"],
               "payload_fingerprint" => row["payload_fingerprint"], "attempt" => row["attempt"].to_i,
               "stale" => row["stale"].to_i == 1 }
    end

    # Marks the claim completed; false when this run no longer holds it (taken over, held or resolved).
    def complete(claim)
      done = changed(:complete, claim.key, claim.token).positive?
      unless done
        log(:warn, claim.key, "not marked completed: this run no longer holds the claim",
            outcome: "performed", attempt: claim.attempt)
      end
      done
    end

    # Gives up this run's claim after its effect failed, so that the queue's retry may claim it again.
    def release(claim, why)
      changed(:release, claim.key, claim.token, why).positive?
    end

    # Applies the stale-claim policy to the claim with `token`, if it is still that claim and still stale.
    # A Claim when the policy says to perform the effect again (resend, lookup), else nil.
    def apply_policy(key, token)
      status, note = AFTER_LEASE.fetch(policy)
      status ? settle(key, token, status, note) : take_over(key, token, note)
    end

    # [key, token, claimed_at] of claims older than the lease, oldest first, from claimed_at `from` on (where the
    # previous batch ended: a sweep that drains goes on from there).
    def stale_claims(limit: 100, from: nil)
      rows = from.nil? ? all(:stale, limit) : all(:stale_from, limit, from)
      rows.map { |row| [row["operation_key"], row["claim_token"], row["claimed_at"]] }
    end

    # Deletes the completed records older than `days` and returns how many, in batches along the unique index:
    # one pass over it whatever the table's size, each batch committed on its own so no lock is held for long.
    # Refused (ArgumentError, one line naming the minimum) unless `days` is longer than the longest time in which
    # Sidekiq may run a message of `job` again: a duplicate that came after its record was gone would run again.
    def retain(days:, job:, batch: 1000)
      window = self.class.redelivery_window(job, lease_seconds)
      unless days * 86_400 > window
        raise ArgumentError, "#{job_type}: DAYS=#{format('%g', days)} is refused: records must outlive the job's " \
                             "redelivery window (#{self.class.retries(job)} Sidekiq retries and the " \
                             "#{lease_seconds} s lease: #{format('%.3f', window / 86_400.0)} days); the minimum is " \
                             "DAYS=#{(((window / 86_400.0) * 100).floor + 1) / 100.0}"
      end

      deleted = 0
      after = ""
      while (last = first(:batch_end, after, batch)&.fetch("last"))
        deleted += changed(:delete_completed, after, last, days * 86_400)
        after = last
      end
      deleted
    end

    # The longest time, in seconds, in which Sidekiq may run a message of `job` again after its first attempt:
    # every retry at the longest delay of Sidekiq's schedule ((count**4) + 15 s, plus up to 9 * (count + 1) s of
    # jitter), and one lease for the run in progress. A job with its own sidekiq_retry_in needs its own figure.
    def self.redelivery_window(job, lease_seconds)
      (0...retries(job)).sum { |count| (count**4) + 15 + (9 * (count + 1)) } + lease_seconds
    end

    # The most retries Sidekiq may give a message of `job`: those of the job's sidekiq_options, or of Sidekiq's
    # default options where more. A message pushed by the class's name (Sidekiq::Client.push("class" => "...",
    # ...), as another app does) carries Sidekiq's defaults, not the job's options: retry: true, Sidekiq's
    # max_retries (25 unless configured).
    def self.retries(job)
      # Sidekiq 6.4 names its defaults default_worker_options.
      by_name = Sidekiq.respond_to?(:default_job_options) ? Sidekiq.default_job_options : Sidekiq.default_worker_options
      [job.get_sidekiq_options["retry"], by_name["retry"]].map { |option| retries_of(option) }.max
    end

    # Retries of a message's `retry`: a number, true (Sidekiq's max_retries) or false (none).
    def self.retries_of(option)
      return option if option.is_a?(Integer)
      return 0 unless option

      config = Sidekiq.respond_to?(:default_configuration) ? Sidekiq.default_configuration : Sidekiq.options
      config[:max_retries] || 25
    end
{%- if kind.one_transaction %}

    # Where the kit's statements go inside Claims#transaction (a fiber's own: Thread#[]).
    INSIDE = :{{ c.project_slug }}_claims_inside

    # Runs the block in one transaction of the app's ActiveRecord, on one connection given back at its end: the
    # claim, the effect's row (written through ActiveRecord, on the same connection) and the completion commit
    # together or not at all. The kit's statements inside go to that transaction's connection as they are sent:
    # ActiveRecord's lookup of the app's pool, for each, took more time than anything else of the kit's.
    def transaction(&)
      {{ mod }}.with_connection do |connection|
        connection.transaction { inside(connection, &) }
      end
    end
{%- endif %}

    # The SQL for "now" on the database's clock, for an effect that writes a row in the same database.
    def now_sql
      Statements::DIALECTS.fetch(adapter)[:now]
    end

    # The statement `name` as the kit sends it to this database ($1, $2... on PostgreSQL, ?1, ?2... on SQLite).
    def sql(name)
      statements.fetch(name)
    end

    # The plan the database chooses for statement `name` with these values, as EXPLAIN prints it. On PostgreSQL
    # on the connection where the statement would run now (see prepared_on), for the statement prepared there:
    # `generic: true`, the plan it keeps once it stops planning each run; else the plan for these values.
    # `run: true` runs it too, undone after, and counts the pages it touched (EXPLAIN ANALYZE, BUFFERS).
    def plan(name, *values, generic: false, run: false)
      if adapter == "postgresql"
        pool = {{ mod }}.connection_pool
        where = prepared_on(pool) || Session.current(pool)
        return where.plan(name, statements.fetch(name), values, generic: generic, run: run)
      end

      {{ mod }}.with_connection do |connection|
        connection.exec_query(
          "EXPLAIN QUERY PLAN #{statements.fetch(name)}", "{{ mod }} claims", values
        )
                  .map { |row| row["detail"] }.join("\n")
      end
    end

    private

    # The record says what this run may do, now that it could not claim the key.
    def decide(key, fingerprint, record)
      conflict!(key, "refused, nothing done") if record["payload_fingerprint"] != fingerprint

      case record["status"]
      when "queued" then claim_queued(key, fingerprint, record["claim_token"])
      when "released" then take_over(key, record["claim_token"], "released after a failed effect: one more attempt")
      when "claimed"
        return skip(key, "claimed by another run inside the lease") unless record["stale"].to_i == 1

        apply_policy(key, record["claim_token"])
      else skip(key, "already #{record['status']}")
      end
    end

    def conflict!(key, outcome)
      log(:error, key, "conflict: the key is recorded with another payload; #{outcome}", outcome: "refused")
      raise PayloadConflict, "#{job_type} #{key}: the key is already recorded with another payload"
    end

    def skip(key, why)
      log(:info, key, "skipped: #{why}", outcome: "skipped")
      notify(key, "skipped")
      nil
    end

    # A record the app's send left queued is claimed as a new key would be, by a compare-and-swap on the token
    # seen: of two runs that meet it at once, one claims it and the other then meets a young claim.
    def claim_queued(key, fingerprint, seen_token)
      row = first(:claim_queued, key, seen_token)
      return Claim.new(key: key, token: row["claim_token"], attempt: row["attempt"].to_i, taken_over: false) if row

      record = first(:read, key)
      return skip(key, "claimed by another run inside the lease") if record.nil? || record["status"] == "queued"

      decide(key, fingerprint, record)
    end

    # Compare-and-swap: a new token, attempt + 1 and a fresh claimed_at, only where the token is still the one
    # seen and the claim is still stale (or released). Two late runs cannot both win.
    def take_over(key, seen_token, why)
      row = first(:take_over, key, seen_token, why)
      return skip(key, "another run took it over first") unless row

      attempt = row["attempt"].to_i
      log(:warn, key, "taken over (attempt #{attempt}): #{why}", outcome: "taking over", attempt: attempt)
      Claim.new(key: key, token: row["claim_token"], attempt: attempt, taken_over: true)
    end

    # Moves a stale claim to held or abandoned, if it is still that claim and still stale.
    def settle(key, seen_token, status, why)
      settled = changed(:settle, key, seen_token, status, why).positive?
      return skip(key, "another run settled the stale claim first") unless settled

      log(:warn, key, why, outcome: status)
      notify(key, status)
      nil
    end

    def adapter
      {{ mod }}.connection_pool.db_config.adapter
    end

    # Every statement of the kit for this database, built once.
    def statements(adapter = self.adapter)
      @statements[adapter] ||= Statements.new(adapter, job_type: job_type, table: table,
                                                       lease_seconds: lease_seconds).to_h
    end

    def first(name, *values)
      all(name, *values).first
    end

    # The rows of statement `name`, as Hashes of column name to value.
    def all(name, *values, own: true)
      run(name, values, rows: true, own: own)
    end

    # The number of records statement `name` changed.
    def changed(name, *values)
      run(name, values, rows: false)
    end

    # On PostgreSQL as prepared statements (own: true), else through ActiveRecord.
    def run(name, values, rows:, own: true)
{%- if kind.one_transaction %}
      # Inside Claims#transaction on PostgreSQL: that transaction's Guest, found without asking ActiveRecord.
      inside = Thread.current[INSIDE] if own
      return inside.run(name, statements("postgresql").fetch(name), values, rows) if inside
{% endif %}
      pool = {{ mod }}.connection_pool
      adapter = pool.db_config.adapter
      text = statements(adapter).fetch(name)
      where = prepared_on(pool) if adapter == "postgresql" && own
      return where.run(name, text, values, rows) if where

      pool.with_connection { |connection| through(connection, text, values, rows) }
    end

    # Where the kit's prepared statements run on PostgreSQL: the thread's own connection (Session)
{%- if kind.one_transaction %}
    # or, inside the job's transaction, that transaction's connection (Guest): the effect writes its row in there,
    # with the claim and its completion. nil inside a transaction when the app prepares no statements (PgBouncer in
    # transaction mode): then ActiveRecord sends them in full.
    def prepared_on(pool)
      connection = pool.active_connection?
      return Session.current(pool) unless connection&.transaction_open?

      Guest.on(connection) if Session.prepares?(pool)
    end

    # The block, with the kit's statements going to `connection`'s open transaction (where there is a Guest: on
    # PostgreSQL, with prepared statements), and back to where they went before at its end.
    def inside(connection)
      outer = Thread.current[INSIDE]
      pool = connection.pool
      Thread.current[INSIDE] = (prepared_on(pool) if pool.db_config.adapter == "postgresql")
      yield
    ensure
      Thread.current[INSIDE] = outer
    end
{%- else %}
    # (so that a claim commits at once, whatever transaction the app has open).
    def prepared_on(pool)
      Session.current(pool)
    end
{%- endif %}

    def through(connection, text, values, rows)
      return connection.exec_query(text, "{{ mod }} claims", values).to_a if rows

      connection.exec_update(text, "{{ mod }} claims", values)
    end

    # The kit's SQL, per database. Parameters are the values of each call; the job type, the table and the
    # lease are written in, once.
    class Statements
      # SQL that reads the database's clock, per adapter; "%<column>s older than %<seconds>s seconds"; that
      # draws a claim token (PostgreSQL 13 or later has gen_random_uuid); a moment as a person reads it (UTC); the
      # role the database sees (the audit's, which no caller can give); what locks the rows a SELECT reads.
      DIALECTS = {
        "postgresql" => {
          token: "CAST(gen_random_uuid() AS text)",
          now: "clock_timestamp()",
          older: "%<column>s < clock_timestamp() - make_interval(secs => %<seconds>s)",
          age: "EXTRACT(EPOCH FROM clock_timestamp() - %<column>s)",
          shown: "CAST(date_trunc('second', %<column>s AT TIME ZONE 'UTC') AS text)",
          role: "current_user",
          lock: " FOR UPDATE"
        },
        "sqlite3" => {
          token: "lower(hex(randomblob(16)))",
          now: "julianday('now')",
          older: "%<column>s < julianday('now') - %<seconds>s / 86400.0",
          age: "(julianday('now') - %<column>s) * 86400.0",
          shown: "datetime(%<column>s)",
          # SQLite has no roles; a write transaction locks the whole database
          role: "NULL",
          lock: ""
        }
      }.freeze

      # The guard of every statement that changes one key's record: `status || '' = 'claimed'`, never
      # `status = 'claimed'`, which would let the planner read through the partial index of claimed rows (when
      # the statistics say it is nearly empty) and walk every claim of a backlog. No index matches this form, so
      # the unique (job_type, operation_key) index serves these statements whatever the statistics say.
      GUARD = "status || '' = '%s'"

      def initialize(adapter, job_type:, table:, lease_seconds:)
        @adapter = adapter
        @dialect = DIALECTS.fetch(adapter) do
          raise "#{job_type}: the record needs PostgreSQL or SQLite, not #{adapter}"
        end
        @job_type = job_type
        @table = table
        @lease_seconds = lease_seconds
      end

      def to_h
        sql = by_key.merge(sending).merge(sweeping).merge(retention).merge(audit)
        return sql if @adapter == "postgresql"

        # SQLite numbers its parameters ?1, ?2...; it cannot put an INSERT in a WITH, so a duplicate reads after it.
        sql.merge(claim: insert).transform_values { |text| text.gsub(/\$(\d+)/, '?\1') }
      end

      private

      def now
        @dialect[:now]
      end

      def stale
        older_than(@lease_seconds)
      end

      def older_than(seconds)
        format(@dialect[:older], column: "claimed_at", seconds: seconds)
      end

      def guard(status)
        format(GUARD, status)
      end

      def shown(column)
        format(@dialect[:shown], column: column)
      end

      def key
        "job_type = '#{@job_type}' AND operation_key = $1"
      end

      def insert
        <<~SQL
          INSERT INTO #{@table} (job_type, operation_key, payload_fingerprint, status, claim_token, attempt, claimed_at)
          VALUES ('#{@job_type}', $1, $2, 'claimed', #{@dialect[:token]}, 1, #{now})
          ON CONFLICT (job_type, operation_key) DO NOTHING
          RETURNING 1 AS mine, status, claim_token, payload_fingerprint, attempt, 0 AS stale
        SQL
      end

      # The statements that find their row by key, through the unique index.
      def by_key # rubocop:disable Metrics/MethodLength -- the SQL reads best in one piece
        record = "status, claim_token, payload_fingerprint, attempt, CASE WHEN #{stale} THEN 1 ELSE 0 END AS stale"
        {
          # Claimed, or the record that was there, in one statement. Empty only when the record was committed
          # after this statement began (its snapshot cannot see it): then the claim reads it.
          claim: <<~SQL,
            WITH inserted AS (#{insert.strip})
            SELECT * FROM inserted
            UNION ALL
            SELECT 0, #{record} FROM #{@table} WHERE #{key} AND NOT EXISTS (SELECT FROM inserted)
          SQL
          read: "SELECT 0 AS mine, #{record} FROM #{@table} WHERE #{key}",
          details: "SELECT payload FROM #{@table} WHERE #{key}",
          complete: <<~SQL,
            UPDATE #{@table} SET status = 'completed', completed_at = #{now}
            WHERE #{key} AND claim_token = $2 AND #{guard('claimed')}
          SQL
          release: <<~SQL,
            UPDATE #{@table} SET status = 'released', note = $3
            WHERE #{key} AND claim_token = $2 AND #{guard('claimed')}
          SQL
          take_over: <<~SQL,
            UPDATE #{@table}
            SET claim_token = #{@dialect[:token]}, attempt = attempt + 1, status = 'claimed', claimed_at = #{now},
                note = $3
            WHERE #{key} AND claim_token = $2 AND (#{guard('released')} OR (#{guard('claimed')} AND #{stale}))
            RETURNING attempt, claim_token
          SQL
          settle: <<~SQL,
            UPDATE #{@table} SET status = $3, note = $4
            WHERE #{key} AND claim_token = $2 AND #{guard('claimed')} AND #{stale}
          SQL
          # Done: completed. Released: queued again, with a new token and its attempt kept, sent by the caller.
          resolve: <<~SQL
            UPDATE #{@table}
            SET status = $2, completed_at = CASE WHEN $3 = 1 THEN #{now} ELSE completed_at END,
                claim_token = CASE WHEN $3 = 1 THEN claim_token ELSE #{@dialect[:token]} END,
                claimed_at = CASE WHEN $3 = 1 THEN claimed_at ELSE #{now} END,
                resolved_by = $4, resolved_at = #{now}, note = COALESCE(note || ' | ', '') || $5
            WHERE #{key} AND (#{guard('held')} OR #{guard('failed')})
            RETURNING payload
          SQL
        }
      end

      # The app's send, the claim of what it queued, and what Sidekiq's last retry leaves: all by key.
      def sending # rubocop:disable Metrics/MethodLength -- the SQL reads best in one piece
        {
          # The payload and its fingerprint as the claim compares them; attempt 0: no run has claimed it yet.
          enqueue: <<~SQL,
            INSERT INTO #{@table}
              (job_type, operation_key, payload_fingerprint, payload, status, claim_token, attempt, claimed_at)
            VALUES ('#{@job_type}', $1, $2, $3, 'queued', #{@dialect[:token]}, 0, #{now})
            ON CONFLICT (job_type, operation_key) DO NOTHING
          SQL
          claim_queued: <<~SQL,
            UPDATE #{@table}
            SET claim_token = #{@dialect[:token]}, attempt = attempt + 1, status = 'claimed', claimed_at = #{now}
            WHERE #{key} AND claim_token = $2 AND #{guard('queued')}
            RETURNING attempt, claim_token
          SQL
{%- if kind.one_transaction %}
          # Released, or queued: the effect's error rolls the claim back with its transaction.
          fail: <<~SQL,
            UPDATE #{@table} SET status = 'failed', note = $2
            WHERE #{key} AND (#{guard('released')} OR #{guard('queued')})
          SQL
{%- else %}
          fail: <<~SQL,
            UPDATE #{@table} SET status = 'failed', note = $2
            WHERE #{key} AND #{guard('released')}
          SQL
{%- endif %}
          resent: <<~SQL
            UPDATE #{@table} SET claimed_at = #{now}
            WHERE #{key} AND claim_token = $2 AND #{guard('queued')} AND #{older_than('$3')}
          SQL
        }
      end

      # The sweeper's questions, the statements that read through the partial indexes of claimed and of queued
      # rows; the person's list and the status, which read every record of the job type.
      def sweeping
        stale_claims = <<~SQL
          SELECT operation_key, claim_token, claimed_at FROM #{@table}
          WHERE job_type = '#{@job_type}' AND status = 'claimed' AND #{stale}
        SQL
        {
          stale: "#{stale_claims}ORDER BY claimed_at LIMIT $1",
          stale_from: "#{stale_claims}AND claimed_at >= $2 ORDER BY claimed_at LIMIT $1",
          queued_due: <<~SQL,
            SELECT operation_key, claim_token, payload FROM #{@table}
            WHERE job_type = '#{@job_type}' AND status = 'queued' AND #{older_than('$2')}
            ORDER BY claimed_at LIMIT $1
          SQL
          held: <<~SQL,
            SELECT operation_key AS key, status, attempt, #{shown('claimed_at')} AS claimed_at, note FROM #{@table}
            WHERE job_type = '#{@job_type}' AND status IN ('held', 'failed')
            ORDER BY status DESC, #{@table}.claimed_at
          SQL
          status: status
        }
      end

      # Per state: how many, the age of the oldest (of its completion, for completed ones) and how many are past
      # their time (queued: $1 seconds, the re-send time; claimed or released: the lease).
      def status
        since = "CASE WHEN status = 'completed' THEN completed_at ELSE claimed_at END"
        <<~SQL
          SELECT status, COUNT(*) AS count, #{format(@dialect[:age], column: "MIN(#{since})")} AS oldest,
                 SUM(CASE WHEN (status = 'queued' AND #{older_than('$1')})
                            OR (status IN ('claimed', 'released') AND #{stale}) THEN 1 ELSE 0 END) AS overdue
          FROM #{@table} WHERE job_type = '#{@job_type}' GROUP BY status
        SQL
      end

      # A person's resolve, in one transaction (Claims#resolve): the audit row, copied from the record while it
      # waits for a person (and locking it: a second person's resolve then finds it resolved), then the record's
      # change. And every resolution, of one key ($1) or of all ($1 NULL), oldest first.
      def audit
        resolutions = "#{@table}_resolutions"
        {
          audit: <<~SQL,
            INSERT INTO #{resolutions}
              (job_type, operation_key, resolved_at, resolved_by, resolved_as, database_role, status_before,
               status_after, why)
            SELECT job_type, operation_key, #{now}, $3, $5, #{@dialect[:role]}, status, $2, $4 FROM #{@table}
            WHERE #{key} AND (#{guard('held')} OR #{guard('failed')})#{@dialect[:lock]}
            RETURNING status_before, database_role
          SQL
          resolutions: <<~SQL
            SELECT operation_key AS key, #{shown('resolved_at')} AS resolved_at, resolved_by, resolved_as,
                   database_role, status_before, status_after, why
            FROM #{resolutions}
            WHERE job_type = '#{@job_type}' AND (operation_key = $1 OR $1 IS NULL)
            ORDER BY #{resolutions}.resolved_at
          SQL
        }
      end

      # A batch of retention: the last of the next $2 keys after $1, then the old completed records up to it.
      def retention
        {
          batch_end: <<~SQL,
            SELECT MAX(operation_key) AS last FROM (
              SELECT operation_key FROM #{@table} WHERE job_type = '#{@job_type}' AND operation_key > $1
              ORDER BY operation_key LIMIT $2
            ) AS batch
          SQL
          delete_completed: <<~SQL
            DELETE FROM #{@table}
            WHERE job_type = '#{@job_type}' AND operation_key > $1 AND operation_key <= $2
              AND status = 'completed' AND #{format(@dialect[:older], column: 'completed_at', seconds: '$3')}
          SQL
        }
      end
    end

    # The thread's own PostgreSQL connection for the kit's statements, opened from the app's database
    # configuration and kept; each statement is prepared on it once. A checkout from ActiveRecord's pool costs a
    # round trip (the pool verifies the connection), as much as a third commit, and a pool connection held by a
    # thread would make Sidekiq's other threads wait for the pool while an effect runs. A connection that the
    # server or the network closed is replaced before the next statement, or after the one that met the fault:
    # a fault never poisons the thread.
    class Session
      include Prepared

      KEY = :{{ c.project_slug }}_claims_connection
      APPLICATION_NAME = "{{ c.project_slug }} claims"

      # This thread's session for the pool's database: opened on first use, and again when the one it had is gone
      # (closed by the server or the network, inherited over a fork, or to a database the app no longer uses).
      def self.current(pool = {{ mod }}.connection_pool)
        session = Thread.current.thread_variable_get(KEY)
        return session if session&.usable?(pool)

        session&.discard
        Thread.current.thread_variable_set(KEY, nil)
        Thread.current.thread_variable_set(KEY, new(pool))
      end

      # Closes this thread's connection, if it has one (a thread that ends).
      def self.close
        Thread.current.thread_variable_get(KEY)&.discard
        Thread.current.thread_variable_set(KEY, nil)
      end

      def initialize(pool)
        require "pg"
        @pool = pool
        @pid = Process.pid
        config = pool.db_config.configuration_hash
        @prepare = Session.prepares?(pool)
        @prepared = {}
        @connection = connect(config)
      end

      # The PG::Connection itself: the benchmark's floor runs on it.
      attr_reader :connection

      # The server process serving this connection, as pg_stat_activity shows it.
      def backend_pid
        @connection.backend_pid
      end

      # The app's choice: with `prepared_statements: false` (PgBouncer in transaction mode) each goes in full.
      def self.prepares?(pool)
        pool.db_config.configuration_hash[:prepared_statements].to_s != "false"
      end

      # The connection parameters of an ActiveRecord database configuration, as its PostgreSQL adapter gives them.
      def self.params(config)
        require "pg"
        params = config.compact.transform_keys(&:to_sym)
        params[:user] = params.delete(:username) if params.key?(:username)
        params[:dbname] = params.delete(:database) if params.key?(:database)
        params.slice(*PG::Connection.conndefaults_hash.keys)
      end

      def usable?(pool)
        pool.equal?(@pool) && Process.pid == @pid && alive?
      end

      # The rows of a statement (Hashes), or the number of records it changed.
      def run(name, text, values, rows)
        result = if @prepare
                   @connection.exec_prepared(prepared(name, text), values)
                 else
                   @connection.exec_params(text, values)
                 end
        rows ? result.to_a : result.cmd_tuples
      rescue PG::Error => e
        raise translated(e)
      end

      def plan(name, text, values, generic:, run:)
        explain(prepared(name, text), values, generic: generic, run: run, around: %w[BEGIN ROLLBACK])
      end

      def discard
        # A connection inherited over a fork is the parent's: closing it would say goodbye to the server for it.
        @connection.socket_io.reopen(IO::NULL) if Process.pid != @pid
        @connection.finish unless @connection.finished?
      rescue PG::Error, IOError, SystemCallError
        nil
      end

      private

      # Sequential scans are off here: every statement of the kit reads by key or through the partial index, and a
      # plan prepared while the table was tiny must not keep scanning the table once it has grown. Without prepared
      # statements (PgBouncer in transaction mode) each statement is planned afresh, and a setting would stay with
      # the server connection that another client gets next: then nothing is set.
      def connect(config)
        # Named, so that pg_stat_activity tells the kit's connections from the app's.
        PG.connect({ application_name: APPLICATION_NAME }.merge(Session.params(config))).tap do |connection|
          # What the server says while the connection is idle comes as a notice; FATAL is its last word.
          connection.set_notice_receiver do |notice|
            @ended = true if notice.result_error_field(PG::PG_DIAG_SEVERITY_NONLOCALIZED) == "FATAL"
          end
          connection.exec("SET enable_seqscan = off") if @prepare
          connection.exec("SET search_path TO #{config[:schema_search_path]}") if config[:schema_search_path]
        end
      rescue PG::Error => e
        raise ActiveRecord::ConnectionNotEstablished, "#{e.class}: #{e.message}"
      end

      # Without a round trip: reads what the server sent meanwhile. A server that ends the connection (restart,
      # pg_terminate_backend) says so first, then closes it.
      def alive?
        @connection.consume_input
        @connection.is_busy # parses what came, so that a notice reaches the receiver
        !@ended && @connection.status == PG::CONNECTION_OK
      rescue PG::Error
        false
      end

      # ActiveRecord's errors, as the app's other statements raise them. A connection that broke is dropped, so
      # that the next statement opens another.
      def translated(error)
        if @connection.status != PG::CONNECTION_OK
          discard
          Thread.current.thread_variable_set(KEY, nil) if Thread.current.thread_variable_get(KEY).equal?(self)
        end
        active_record_error(error)
      end
    end
{%- if kind.one_transaction %}

    # The kit's statements inside the job's transaction, on ActiveRecord's own PG::Connection, each prepared there
    # once. Sent as ActiveRecord sends statements, they would cost more than themselves (its logging, type casting
    # and instrumentation, and a plan made for each run). The app's connection keeps its settings: sequential scans
    # are turned off for the transaction only, in the same round trip as the kit's first statement in it.
    class Guest
      include Prepared

      # Where a PG::Connection keeps its guest: on itself, so that the guest lives and goes with it.
      KEY = :@{{ c.project_slug }}_guest

      # The guest on `connection`, an ActiveRecord connection with a transaction open. Asking ActiveRecord for its
      # raw connection sends the transaction's BEGIN; ActiveRecord 7.1 and later also learn that statements they
      # did not see ran in there, so that they never replay the transaction on another connection after a fault.
      def self.on(connection)
        raw = connection.raw_connection
        guest = raw.instance_variable_get(KEY)
        # A connection that ActiveRecord reset reaches another server process, where nothing is prepared.
        guest = raw.instance_variable_set(KEY, new(raw)) unless guest&.backend_pid == raw.backend_pid
        guest.within(connection.current_transaction)
      end

      attr_reader :backend_pid

      def initialize(connection)
        @connection = connection
        @backend_pid = connection.backend_pid
        @prepared = {}
      end

      # The transaction (or savepoint) of ActiveRecord's that the next statements run in, by its object_id (never
      # reused): a finished one is not kept alive.
      def within(transaction)
        @transaction = transaction.object_id
        self
      end

      def run(name, text, values, rows)
        params = values.map { |value| value.nil? ? "NULL" : @connection.escape_literal(value.to_s) }.join(", ")
        # Once a transaction: SET LOCAL lasts until it ends, or until the savepoint it was sent in rolls back (and
        # what follows runs in another of ActiveRecord's transaction objects).
        settings = "SET LOCAL enable_seqscan = off; " unless @transaction == @settings_sent_in
        result = @connection.exec("#{settings}EXECUTE #{prepared(name, text)}(#{params})")
        @settings_sent_in = @transaction
        rows ? result.to_a : result.cmd_tuples
      rescue PG::Error => e
        # The app's connection was reset in place (DISCARD ALL), its prepared statements with it: the transaction
        # fails, and Sidekiq's retry prepares them again.
        @prepared.clear if e.is_a?(PG::InvalidSqlStatementName)
        raise active_record_error(e)
      end

      # Inside the job's transaction, undone by a savepoint.
      def plan(name, text, values, generic:, run:)
        around = ["SAVEPOINT {{ c.project_slug }}_plan; SET LOCAL enable_seqscan = off",
                  "ROLLBACK TO SAVEPOINT {{ c.project_slug }}_plan"]
        explain(prepared(name, text), values, generic: generic, run: run, around: around)
      end
    end
{%- endif %}
  end
end
