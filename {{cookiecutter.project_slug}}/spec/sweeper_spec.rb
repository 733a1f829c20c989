{%- from "replay_matrix.jinja" import policy with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

# The sweeper drains: it goes on, batch after batch, while it finds stale claims, within its time budget; a
# claim it cannot settle is met once per sweep and does not stop the others.
RSpec.describe "the stale-claim sweeper" do
  let(:kit) { {{ mod }} }
  let(:sweeper) { {{ mod }}::StaleClaimSweeperJob }
  let(:job) { ReplayHarness::JOB.new }

  # Claims of `count` keys, as workers that died after claiming leave them, aged past the lease.
  def stale_claims(count)
    Array.new(count) { |n| format("STALE-%03d", n + 1) }.each do |key|
      kit.claims.claim(key, job.send(:fingerprint, key, kit::Effect.details_for(key)))
      age_past_lease(key)
    end
  end

  it "settles every stale claim in one sweep, batch after batch" do
    keys = stale_claims(25)

    expect(sweeper.sweep(batch: 10)).to eq(25)
    expect(keys.map { |key| record(key) }.uniq).to eq(["{{ policy.after_lease }}"])
    expect(sweeper.sweep(batch: 10)).to eq(0)
  end

  it "meets a claim it cannot settle once per sweep, and settles the others" do
    keys = stale_claims(12)
    stuck = keys[3]
    allow(kit::Claims).to receive(:new).and_call_original
    allow(kit.claims).to receive(:apply_policy).and_wrap_original do |original, key, token|
      raise kit::Claims::PayloadConflict, "#{key}: cannot be settled" if key == stuck

      original.call(key, token)
    end

    expect(sweeper.sweep(batch: 5)).to eq(12)
    expect(record(stuck)).to eq("claimed")
    expect((keys - [stuck]).map { |key| record(key) }.uniq).to eq(["{{ policy.after_lease }}"])
  end

  it "stops at its time budget; the next sweep goes on from the oldest claim left" do
    stale_claims(6)

    expect(sweeper.sweep(batch: 2, budget: 0)).to eq(2)
    expect(sweeper.sweep(batch: 2)).to eq(4)
  end
end
