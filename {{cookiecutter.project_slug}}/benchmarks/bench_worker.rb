{%- from "replay_matrix.jinja" import kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set key = c.operation_key_name -%}
# frozen_string_literal: true

# What the benchmark's sidekiq process loads: the kit, a bare job that performs the same effect without the
# claim, and the floor's job, which the kit's job is compared with.
#   sidekiq -r ./benchmarks/bench_worker.rb -q <the benchmark's queue>
require_relative "../lib/{{ c.project_slug }}"

module {{ mod }}
  # The effect alone: the same details, the same effect, no record.
  class BenchBareJob
    include Sidekiq::Job

    sidekiq_options retry: false

    def perform({{ key }})
      Effect.perform({{ key }}, Effect.details_for({{ key }}))
    end
  end

  # The physical floor: the kit's claim and completion statements, raw and prepared, on the connection the kit
  # sends them on, around the same effect{{ ", in one transaction with it" if kind.one_transaction else "" }}.
  class BenchFloorJob
    include Sidekiq::Job

    sidekiq_options retry: false

    # The PG::Connections (compared by identity) where the floor's statements are prepared.
    PREPARED = {}.compare_by_identity
    LOCK = Mutex.new

    def perform({{ key }})
      details = Effect.details_for({{ key }})
{%- if kind.one_transaction %}
      {{ mod }}.with_connection do |connection|
        raw = prepared(connection.raw_connection)
        raw.transaction do
          claim_around(raw, {{ key }}) { Effect.perform({{ key }}, details) }
        end
      end
{%- else %}
      raw = prepared(Claims::Session.current.connection)
      claim_around(raw, {{ key }}) { Effect.perform({{ key }}, details) }
{%- endif %}
    end

    private

    def claim_around(raw, {{ key }})
      token = raw.exec_prepared("floor_claim", [{{ key }}, "floor"])[0]["claim_token"]
      yield
      raw.exec_prepared("floor_complete", [{{ key }}, token])
    end

    def prepared(raw)
      LOCK.synchronize do
        PREPARED[raw] ||= %i[claim complete].each do |name|
          raw.prepare("floor_#{name}", {{ mod }}.claims.sql(name))
        end
      end
      raw
    end
  end
end
