{%- set t = cookiecutter.record_table -%}
# frozen_string_literal: true

# The second revision of the record, as in schema.sql. The first indexed every row by (status, claimed_at); at a
# million completed rows that index is tens of MiB, and with statistics taken while nothing was claimed the
# planner read single keys through it, walking every claim of a backlog. The sweeper's one question (which claims
# are older than the lease?) needs only the claimed rows: a partial index of them stays a few kilobytes. Every
# other statement finds its row through the unique (job_type, operation_key) index. A new migration, not an edit
# of the first: apps have applied that one already. install_into_rails.rb copies both.
class IndexClaimed{{ t.split("_")|map("capitalize")|join }} < ActiveRecord::Migration[6.1]
  def change
    remove_index :{{ t }}, %i[status claimed_at],
                 name: "{{ t }}_by_status"
    add_index :{{ t }}, :claimed_at,
              where: "status = 'claimed'", name: "{{ t }}_claimed"
  end
end
