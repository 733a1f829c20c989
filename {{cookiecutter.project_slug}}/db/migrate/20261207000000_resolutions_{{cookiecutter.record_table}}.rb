{%- from "replay_matrix.jinja" import max_key_length with context -%}
{%- set t = cookiecutter.record_table -%}
# frozen_string_literal: true

# The fourth revision, as in schema.sql: every resolution by a person, kept. The record says who resolved it last;
# this table every time, with the name given, who the system knew, the database's role, the states before and
# after, and why. Retention, which deletes completed records, leaves it alone.
class Resolutions{{ t.split("_")|map("capitalize")|join }} < ActiveRecord::Migration[6.1]
  def change
    create_table :{{ t }}_resolutions, id: false do |t|
      t.string :job_type, limit: 100, null: false
      t.string :operation_key, limit: {{ max_key_length }}, null: false
      t.column :resolved_at, "timestamp with time zone", null: false
      t.string :resolved_by, limit: 255, null: false
      t.string :resolved_as, limit: 255, null: false
      t.string :database_role, limit: 255
      t.string :status_before, limit: 16, null: false
      t.string :status_after, limit: 16, null: false
      t.text :why, null: false
      t.index %i[job_type operation_key resolved_at], name: "{{ t }}_resolutions_operation"
    end
  end
end
