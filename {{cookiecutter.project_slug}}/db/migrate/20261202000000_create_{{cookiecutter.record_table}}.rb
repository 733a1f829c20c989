{%- from "replay_matrix.jinja" import kind, max_key_length with context -%}
{%- set c = cookiecutter -%}
{%- set t = c.record_table -%}
# frozen_string_literal: true

# The record of handled operations, as in schema.sql (the suite checks that the two agree). No id: the key
# is (job_type, operation_key). Timestamps have no default: the claim code writes them with the database's
# clock. In a Rails app, install_into_rails.rb copies it with a new timestamp and the app's migration version.
class Create{{ t.split("_")|map("capitalize")|join }} < ActiveRecord::Migration[6.1]
  def change
    create_table :{{ t }}, id: false do |t|
      t.string :job_type, limit: 100, null: false
      t.string :operation_key, limit: {{ max_key_length }}, null: false
      t.string :payload_fingerprint, limit: 64, null: false
      t.text :payload
      t.string :status, limit: 16, null: false, default: "claimed"
      t.string :claim_token, limit: 36, null: false
      t.integer :attempt, null: false, default: 1
      t.column :claimed_at, "timestamp with time zone", null: false
      t.column :completed_at, "timestamp with time zone"
      t.text :note
      t.string :resolved_by, limit: 255
      t.column :resolved_at, "timestamp with time zone"
      t.check_constraint "status IN ('claimed', 'completed', 'held', 'abandoned', 'released')",
                         name: "{{ t }}_status"
      # ON CONFLICT (job_type, operation_key) needs this unique index.
      t.index %i[job_type operation_key], unique: true, name: "{{ t }}_operation"
      # The sweeper's question: which claims are older than the lease?
      t.index %i[status claimed_at], name: "{{ t }}_by_status"
    end
{%- if kind.one_transaction %}

    # The effect itself: a row written in the claim's own transaction. No unique key on purpose: the replay
    # suite counts these rows, so a second effect would show rather than fail.
    create_table :{{ c.job_type }}_effects, id: false do |t|
      t.string :operation_key, limit: {{ max_key_length }}, null: false
      t.text :payload, null: false
      t.column :performed_at, "timestamp with time zone", null: false
    end
{%- endif %}
  end
end
