{%- set c = cookiecutter -%}
# frozen_string_literal: true

# More deliveries at once than the database pool has connections. The job holds a connection only for the
# statement it runs, so no thread waits out the pool's checkout timeout, and every key is performed once.
RSpec.describe "{{ c.job_type }} under a flood" do
  keys = Array.new(20) { |n| format("FLOOD-%03d", n + 1) }

  it "performs each of #{keys.size} keys once from #{keys.size * 3} deliveries on more threads than connections" do
    expect(queue.threads).to be > queue.pool_size

    outcomes, log = logged { queue.flood(keys.flat_map { |key| [[key]] * 3 }) }

    expect(log).not_to include("ConnectionTimeoutError")
    expect(outcomes.tally).to eq("returned" => keys.size * 3)
    expect(effects.count).to eq(keys.size)
    expect(keys.map { |key| record(key) }.uniq).to eq(["completed"])
    expect(queue.leftovers.values).to all(eq(0))
  end
end
