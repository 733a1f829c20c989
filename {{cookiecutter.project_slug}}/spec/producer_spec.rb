{%- from "replay_matrix.jinja" import rb, kind with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

require "json"
require "timeout"

# The app's way to send, the job's enqueue: the record first (queued), then the message, and inside the app's
# ActiveRecord transaction only once it commits. The claim of a queued record, and the sweeper sending again a
# message the broker lost. Live, the messages go through Redis to a real worker process; effects are
# counted where they arrive.
RSpec.describe "the producer of {{ c.job_type }}" do
  let(:kit) { {{ mod }} }
  let(:job_class) { ReplayHarness::JOB }
  let(:key) { {{ rb(c.example_key) }} }
  let(:details) { kit::Effect.details_for(key) }
  # The jids of the messages pushed, in order, counted where the job's class pushes them.
  let(:pushed) { [] }

  before do
    allow(job_class).to receive(:perform_async).and_wrap_original do |original, *args|
      original.call(*args).tap { |jid| pushed << jid }
    end
  end

  def row(key)
    sql = "SELECT * FROM {{ c.record_table }} WHERE operation_key = ?"
    ActiveRecord::Base.connection.select_one(ActiveRecord::Base.sanitize_sql_array([sql, key]))
  end

  # A record queued as enqueue writes it, with no message: one that the broker lost.
  def queued_without_message(key)
    payload = JSON.generate(details)
    kit.claims.enqueue(key, job_class.new.send(:fingerprint, key, details), payload)
  end

  def eventually(what, seconds = 20)
    Timeout.timeout(seconds, RuntimeError, "timed out waiting until #{what}") { sleep 0.05 until yield }
  end

  it "writes the record queued, then pushes the message, which a worker performs once" do
    seen_at_push = nil
    allow(job_class).to receive(:perform_async).and_wrap_original do |original, *args|
      seen_at_push = row(key)
      original.call(*args).tap { |jid| pushed << jid }
    end

    jid = job_class.enqueue(key, details)

    expect(pushed).to eq([jid])
    expect(seen_at_push).to include("status" => "queued", "attempt" => 0)
    expect(JSON.parse(seen_at_push["payload"])).to eq(details)
    queue.finish(jid)
    expect(effects.count).to eq(1)
    expect(row(key)).to include("status" => "completed", "attempt" => 1)
    expect(row(key)["claim_token"]).not_to eq(seen_at_push["claim_token"])
  end

  it "writes and sends nothing for a key it knows, and refuses the key with other details" do
    jid = job_class.enqueue(key, details)
    queue.finish(jid)
    before = row(key)

    expect(job_class.enqueue(key, details)).to be_nil
    expect { job_class.enqueue(key, details.merge("to" => "someone-else@example.com")) }
      .to raise_error(kit::Claims::PayloadConflict, /already recorded with another payload/)
    expect(pushed).to eq([jid])
    expect(row(key)).to eq(before)
    expect(effects.count).to eq(1)
  end

  it "refuses bad data at the door as a bad message: no record written, nothing pushed" do
    bad = kit::{{ c.job_type.split("_")|map("capitalize")|join }}Job::BadMessage
    max = kit.max_details_bytes
    {
      ["ORD\u0000-1", details] => "{{ c.operation_key_name }} contains a NUL character",
      ["ORD-\xFF", details] => "{{ c.operation_key_name }} is not valid UTF-8",
      [key, details.merge("note" => "\xFF")] => "the details hold a string that is not valid UTF-8",
      [key, details.merge("amount" => Float::NAN)] => "the details are not plain JSON",
      [key, { "blob" => "x" * max }] => "details are #{max + 11} bytes as JSON; at most #{max} (MAX_DETAILS_BYTES)"
    }.each do |(bad_key, bad_details), error|
      expect { job_class.enqueue(bad_key, bad_details) }.to raise_error(bad, /#{Regexp.escape(error)}/)
    end

    expect([records_count, pushed]).to eq([0, []])
  end

  it "takes MAX_DETAILS_BYTES from the environment" do
    small = details.merge("blob" => "x" * 100)
    size = JSON.generate(small).bytesize
    ENV["MAX_DETAILS_BYTES"] = (size - 1).to_s
    expect { job_class.enqueue(key, small) }.to raise_error(/details are #{size} bytes as JSON; at most #{size - 1}/)
    ENV["MAX_DETAILS_BYTES"] = size.to_s
    expect(job_class.enqueue(key, small)).to eq(pushed.first)
    ENV["MAX_DETAILS_BYTES"] = "0"
    expect { job_class.enqueue(key, small) }.to raise_error(ArgumentError, /MAX_DETAILS_BYTES must be a whole number/)
  ensure
    ENV.delete("MAX_DETAILS_BYTES")
    queue.finish(pushed.first) if pushed.any?
  end

  it "inside the app's transaction, rolled back: neither the record nor the message exists" do
    ActiveRecord::Base.transaction do
      expect(job_class.enqueue(key, details)).to be_nil # the push waits for the commit
      # written on the transaction's own connection, where it can be seen before the commit
      expect(records_count).to eq(1)
      raise ActiveRecord::Rollback
    end

    expect(records_count).to eq(0)
    expect(pushed).to be_empty
    expect(queue.leftovers.values).to all(eq(0))
    expect(effects.count).to eq(0)
  end

  it "inside the app's transaction, committed: the message is pushed after the commit, and performed once" do
    ActiveRecord::Base.transaction do
      job_class.enqueue(key, details)
      expect(pushed).to be_empty
    end

    expect(pushed.size).to eq(1)
    queue.finish(pushed.first)
    expect(effects.count).to eq(1)
    expect(record(key)).to eq("completed")
  end

  it "claims a queued record as a new key: attempt 1, a new token, no takeover" do
    queued_without_message(key)
    token = row(key)["claim_token"]

    _, log = logged(SUITE_LOG) { job_class.new.perform(key) }

    expect(row(key)).to include("status" => "completed", "attempt" => 1)
    expect(row(key)["claim_token"]).not_to eq(token)
    expect(log).not_to include("taken over")
    expect(log).to include("#{key}: performed and completed (attempt 1)")
    expect(effects.count).to eq(1)
  end

  it "lets one of two runs at once claim a queued record; the other skips" do
    queued_without_message(key)

    _, log = logged { queue.deliver_concurrently(key) }

    expect(effects.count).to eq(1)
    expect(record(key)).to eq("completed")
{%- if kind.one_transaction %}
    # The second waits for the first's transaction (claim, row, completion), then meets the work done.
    expect(log).to include("skipped: already completed")
{%- else %}
    # The loser of the compare-and-swap reads the record again: claimed, or already completed when the winner
    # finished first.
    expect(log).to match(/skipped: (claimed by another run inside the lease|already completed)/)
{%- endif %}
  end

  it "sends again a message the broker lost, once the record has been queued past the re-send time" do
    queued_without_message(key)
    sweep = -> { logged { queue.sweep }.last[/(\d+) queued operation\(s\) sent again/, 1].to_i }

    expect(sweep.call).to eq(0) # young: its message may still be on its way
    age_past_lease(key) # RESEND_QUEUED_AFTER_SECONDS is the lease unless set
    expect(sweep.call).to eq(1)
    LIVE ? eventually("the re-sent message was performed") { record(key) == "completed" } : queue.finish(nil)

    expect(effects.count).to eq(1)
    expect(row(key)).to include("status" => "completed", "attempt" => 1)
    expect(sweep.call).to eq(0)
  end
end
