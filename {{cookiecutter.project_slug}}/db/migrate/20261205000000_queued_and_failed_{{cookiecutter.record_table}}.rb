{%- from "replay_matrix.jinja" import states, states_added_in_3 -%}
{%- set t = cookiecutter.record_table -%}
{%- set after = [] -%}
{%- for state in states -%}{%- set _ = after.append("'" ~ state ~ "'") -%}{%- endfor -%}
# frozen_string_literal: true

# The third revision of the record, as in schema.sql: the states {{ states_added_in_3|join(" and ") }}. queued: the
# app's send (the job's enqueue) writes the record before it pushes the message, so that a message the broker
# loses is found and sent again by the sweeper, which finds such records through the partial index of queued
# rows. failed: an effect that failed past Sidekiq's retries waits for a person. A new migration, not an edit of
# the first two: apps have applied those. Rolling back refuses while a record is queued or failed: the second
# revision's CHECK has no place for them.
class QueuedAndFailed{{ t.split("_")|map("capitalize")|join }} < ActiveRecord::Migration[6.1]
  # As the first revision wrote it.
  BEFORE = "status IN ('claimed', 'completed', 'held', 'abandoned', 'released')"
  AFTER = "status IN ({{ after|join(', ') }})"

  def up
    replace_status_check(BEFORE, AFTER)
    add_index :{{ t }}, :claimed_at,
              where: "status = 'queued'", name: "{{ t }}_queued"
  end

  def down
    remove_index :{{ t }}, name: "{{ t }}_queued"
    replace_status_check(AFTER, BEFORE)
  end

  private

  # PostgreSQL replaces the CHECK in place. SQLite cannot change a constraint: the table is made again from its
  # own SQL with the other CHECK, its rows and indexes kept. (ActiveRecord's own copy on SQLite would write every
  # column's type anew, datetime for timestamp with time zone, and the table would no longer match schema.sql.)
  def replace_status_check(from, to)
    return rebuild_with_check(from, to) if connection.adapter_name == "SQLite"

    remove_check_constraint :{{ t }}, from, name: "{{ t }}_status"
    add_check_constraint :{{ t }}, to, name: "{{ t }}_status"
  end

  def rebuild_with_check(from, to)
    table = select_value(
      "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = '{{ t }}'"
    )
    raise "{{ t }}: its CHECK is not #{from}; change it by hand" unless table.include?(from)

    indexes = select_values(
      "SELECT sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL " \
      "AND tbl_name = '{{ t }}'"
    )
    copy = '"{{ t }}_revision"'
    execute(table.sub(from, to).sub(/\ACREATE TABLE "?{{ t }}"?/, "CREATE TABLE #{copy}"))
    execute("INSERT INTO #{copy} SELECT * FROM \"{{ t }}\"")
    execute('DROP TABLE "{{ t }}"')
    execute("ALTER TABLE #{copy} RENAME TO \"{{ t }}\"")
    indexes.each { |index| execute(index) }
  end
end
