{%- from "replay_matrix.jinja" import rb, expected, kind, policy with context -%}
{%- set c = cookiecutter -%}
{%- set k = rb(c.example_key) -%}
{%- set k2 = rb(c.other_example_key) -%}
# frozen_string_literal: true

# The seven replay cases for {{ c.job_type }}: effect {{ c.effect_kind }}, stale-claim policy {{ c.stale_claim_policy }}.
# Each row is what POLICY.md promises; each example does it to the real job and observes the effects where
# they arrive and the record in the database.
ROWS = [
{%- for r in expected %}
  { case: {{ r.case }}, attempt: {{ r.attempt|tojson }}, emails: {{ r.emails }}, record: {{ r.record|tojson }} }{{ "," if not loop.last else "" }}
{%- endfor %}
].freeze
EXAMPLE_KEY = {{ k }}
OTHER_EXAMPLE_KEY = {{ k2 }}
# Where a worker is killed, in the words of the report's timeline.
CRASHES = { before_effect: "after the claim, before the effect",
            after_effect: "after the effect, before it was marked completed" }.freeze

RSpec.describe "{{ c.job_type }} replay matrix ({{ c.effect_kind }}, policy {{ c.stale_claim_policy }})" do
  # Runs one case, compares what it observed with the row, and adds both to replay-report.json, with the steps
  # the case noted on its way (its timeline).
  def replay(number)
    row = ROWS.fetch(number - 1)
    expected = { emails: row[:emails], record: row[:record] }
    entry = { case: number, attempt: row[:attempt], expected: expected, observed: nil, passed: false, timeline: [] }
    ReplayReport.rows << entry
    entry[:observed] = yield entry[:timeline]
    entry[:passed] = entry[:observed] == expected
    expect(entry[:observed]).to eq(expected)
  end

  # One step of a timeline: what was done, then the record and the effects counted so far.
  def step(what)
    "#{what}: record #{record(EXAMPLE_KEY)}, #{effects.count} effect(s)"
  end
{% for r in expected %}
  it "case {{ r.case }}: {{ r.attempt }}: {{ r.emails }} effect{{ 's' if r.emails != 1 else '' }}, {{ r.record }}" do
    replay({{ r.case }}) do{{ " |timeline|" if r.case in [5, 6, 7] else "" }}
{%- if r.case == 1 %}
      queue.deliver(EXAMPLE_KEY)
      { emails: effects.count, record: record(EXAMPLE_KEY) }
{%- elif r.case == 2 %}
      message = queue.deliver(EXAMPLE_KEY)
      queue.redeliver(message)
      { emails: effects.count, record: record(EXAMPLE_KEY) }
{%- elif r.case == 3 %}
      queue.deliver_concurrently(EXAMPLE_KEY)
      { emails: effects.count, record: record(EXAMPLE_KEY) }
{%- elif r.case == 4 %}
      queue.deliver(EXAMPLE_KEY)
      queue.deliver(OTHER_EXAMPLE_KEY)
      { emails: effects.count, record: [record(EXAMPLE_KEY), record(OTHER_EXAMPLE_KEY)].join(", ") }
{%- elif r.case in [5, 6] and kind.one_transaction %}
      message = queue.deliver_and_die(EXAMPLE_KEY, at: :{{ r.crash }})
      after_death = record(EXAMPLE_KEY)
      timeline << step("a worker was killed with SIGKILL #{CRASHES[:{{ r.crash }}]}")
      queue.redeliver(message)
      timeline << step("the message was delivered again")
      { emails: effects.count, record: "#{after_death}, then #{record(EXAMPLE_KEY)}" }
{%- elif r.case in [5, 6] %}
      message = queue.deliver_and_die(EXAMPLE_KEY, at: :{{ r.crash }})
      after_death = record(EXAMPLE_KEY)
      timeline << step("a worker claimed it and was killed with SIGKILL #{CRASHES[:{{ r.crash }}]}")
      queue.redeliver(message) # inside the lease: the young claim is left alone
      inside_lease = record(EXAMPLE_KEY)
      timeline << step("the message was delivered again, inside the lease")
      age_past_lease(EXAMPLE_KEY)
      timeline << "the claim was aged past the lease ({{ c.lease_seconds|int + 1 }} s) in SQL"
      queue.sweep
      timeline << step("the sweeper applied the policy `{{ c.stale_claim_policy }}`")
      before = after_death == inside_lease ? after_death : "#{after_death} (#{inside_lease} after a redelivery)"
      { emails: effects.count, record: "#{before}, then #{record(EXAMPLE_KEY)}" }
{%- else %}
      message = queue.deliver_and_die(EXAMPLE_KEY, at: :before_effect)
      timeline << step("as in case 5, a worker was killed with SIGKILL #{CRASHES[:before_effect]}")
      queue.redeliver(message)
      timeline << step("the message was delivered again, inside the lease")
      { emails: effects.count, record: record(EXAMPLE_KEY) }
{%- endif %}
    end
  end
{% endfor -%}
end
