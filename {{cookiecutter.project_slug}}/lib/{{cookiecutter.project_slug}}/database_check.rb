{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set t = c.record_table -%}
# frozen_string_literal: true

require "securerandom"

module {{ mod }}
  # Whether a worker can use its database: connect, log in, and find `{{ t }}`
  # at its latest revision (the third admits queued and failed records, the fourth keeps every resolution). A
  # worker that started without it would take messages and fail each one in turn, where one line at the start
  # says what to do.
  module DatabaseCheck
    CREATE = "create it, or set DATABASE_URL to the right one"
    # every resolution by a person (revision 4)
    RESOLUTIONS = "{{ t }}_resolutions"
    LOG_IN = "check DATABASE_URL and its credentials"
    # the server down or restarting, the network cut (ActiveRecord 7.1 and later also name a lost connection)
    UNREACHABLE = [ActiveRecord::ConnectionNotEstablished,
                   (ActiveRecord::ConnectionFailed if defined?(ActiveRecord::ConnectionFailed))].compact.freeze

    module_function

    # Stops the process with one line on standard error when the database cannot be used.
    def refuse_to_start_unless_usable
      problem = self.problem
      abort "replay-matrix: #{problem}" if problem
    end

    # What stops the worker from using the database, in one line, or nil.
    def problem
      {{ mod }}.with_connection do |connection|
        next "#{RECORD_TABLE} does not exist in the database; #{migrate}" unless connection.table_exists?(RECORD_TABLE)
        next "#{RECORD_TABLE} is not migrated to revision 3 (no queued or failed records); #{migrate}" unless
          third_revision?(connection)
        next if connection.table_exists?(RESOLUTIONS)

        "#{RECORD_TABLE} is not migrated to revision 4 (no #{RESOLUTIONS}); #{migrate}"
      end
    rescue ActiveRecord::NoDatabaseError => e
      "the database does not exist (#{first_line(e)}): #{CREATE}"
    rescue ActiveRecord::ConnectionNotEstablished => e
      "cannot connect or log in to the database (#{first_line(e)}): #{LOG_IN}"
    end

    # For a database error that will not pass by itself, one line: its cause, then what a person must do (a
    # running worker logs it at ERROR at every retry of the message); nil for one that may pass (a restart, the
    # network), which Sidekiq's retries outlast.
    def person_needed(error)
      cause = first_line(error)[0, 300]
      remedy = case cause
               when /database ".*" does not exist/ then CREATE
               when /authentication failed|role ".*" does not exist|no password supplied/ then LOG_IN
               when /does not exist|no such table/ then "run `#{migration}`"
               when /permission denied/ then "grant DATABASE_URL's role the rights on #{RECORD_TABLE}"
               when /violates check constraint|CHECK constraint failed/ then "migrate it to revision 3: `#{migration}`"
               end
      remedy && "#{cause}: #{remedy}"
    end

    def migrate
      "run `#{migration}`, then start the worker again"
    end

    def migration
      defined?(Rails.autoloaders) ? "bin/rails db:migrate" : "bundle exec rake {{ c.project_slug }}:migrate"
    end

    # The revision's index is there, and its CHECK admits a queued record: one is written and rolled back.
    def third_revision?(connection)
      index = connection.index_name_exists?("{{ t }}", "{{ t }}_queued")
      return false unless index

      connection.transaction(requires_new: true) do
        connection.exec_update(<<~SQL)
          INSERT INTO {{ t }} (job_type, operation_key, payload_fingerprint, status, claim_token, attempt, claimed_at)
          VALUES ('replay-matrix startup check', '#{SecureRandom.hex(8)}', '-', 'queued', '-', 0, CURRENT_TIMESTAMP)
        SQL
        raise ActiveRecord::Rollback
      end
      true
    rescue ActiveRecord::StatementInvalid => e
      raise unless e.message.match?(/check/i)

      false
    end

    # Runs a rake task's work: a database the task cannot use (the server down or restarting, the table not
    # migrated, a login refused) ends it with one line, "<task>: <cause>: <what to do>", and exit status 2, not a
    # backtrace. The task's change is one transaction: all of it happened, or none (`held:list` shows which). So
    # does Redis unreachable at a sweep's re-send.
    def one_line_on_failure(task)
      yield
    rescue ActiveRecord::ConnectionNotEstablished, ActiveRecord::StatementInvalid => e
      unreachable = UNREACHABLE.any? { |kind| e.is_a?(kind) }
      needed = person_needed(e) ||
               (unreachable && "the database cannot be reached (#{first_line(e)}); run it again when it answers")
      raise unless needed

      warn "#{task.name}: #{needed}"
      exit 2
    rescue QueueUnreachable => e
      # the sweep's re-sends: what it could not send waits, queued, for its next run
      warn "#{task.name}: #{e.message}; `rake {{ c.project_slug }}:status` shows what is queued"
      exit 2
    end

    # (sqlite3 2 ends it with a colon, before the statement on the next line)
    def first_line(error)
      error.message.lines.first.to_s.strip.delete_suffix(":")
    end
  end
end
