{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set key = c.operation_key_name -%}
# frozen_string_literal: true

require "securerandom"

# A message that can never succeed is refused at once: a clear error in the log (with a bounded excerpt of the
# message), no effect, no claim left behind, and no retry (nothing escapes the job, so Sidekiq has nothing to
# retry). Live, the refused message is in Sidekiq's dead set with its reason, where a person sees it.
RSpec.describe "bad messages for {{ c.job_type }}" do
  max = {{ mod }}.max_details_bytes
  refused = "{{ mod }}::{{ c.job_type.split('_')|map('capitalize')|join }}Job::BadMessage"

  # The dead set's entries, as Sidekiq's Dead tab shows them (none embedded: there is no Redis).
  def dead
    LIVE ? Sidekiq::DeadSet.new.to_a : []
  end

  # A message as another program might write it, around the arguments' JSON text.
  def raw_message(args)
    %({"class":"#{ReplayHarness::JOB.name}","queue":"default","jid":"#{SecureRandom.hex(12)}","args":#{args}})
  end

  # The job refused the message once: an error in the log, nothing else done, and (live) the message in the
  # dead set with its reason.
  def expect_refused(outcome, log, error, error_class)
    expect(log).to match(/ERROR.*{{ c.job_type }} refused .*#{Regexp.escape(error)}/)
    expect([outcome, effects.count, records_count]).to eq(["returned", 0, 0])
    LIVE ? expect_dead(error, error_class) : expect(queue.leftovers).to(eq(queued: 0))
  end

  def expect_dead(error, error_class)
    expect(queue.leftovers).to eq(queued: 0, scheduled: 0, retries: 0, dead: 1)
    expect(dead.first.item).to include("class" => ReplayHarness::JOB.name, "error_class" => error_class)
    expect(dead.first.item["error_message"]).to include(error)
  end

  {
    "no argument" => [[], "expected the {{ key }} (and its details, from enqueue)"],
    "a null {{ key }}" => [[nil], "{{ key }} must be a string, not NilClass"],
    "a number for the key" => [[1001], "{{ key }} must be a string, not Integer"],
    "a blank {{ key }}" => [["   "], "{{ key }} is empty"],
    "a key longer than the record holds" => [["K" * 256], "{{ key }} has 256 characters"],
    "a NUL in the key" => [["ORD\u0000-1"], "{{ key }} contains a NUL character"],
    "details that are not an object" => [["ORD-1001", "x@example.com"], "the details must be a Hash"],
    "details over MAX_DETAILS_BYTES" => [["ORD-BIG", { "blob" => "x" * max }],
                                         "details are #{max + 11} bytes as JSON; at most #{max} (MAX_DETAILS_BYTES)"],
    "an unexpected third argument" => [["ORD-1001", {}, "x@example.com"], "got 3 arguments"]
  }.each do |problem, (args, error)|
    it "refuses #{problem}: a clear error, no effect, no claim, no retry" do
      outcome, log = logged { queue.deliver_raw(args) }

      expect_refused(outcome, log, error, refused)
    end
  end

  # Bytes that are not UTF-8 cannot be pushed through Sidekiq (its JSON refuses them), but another program can
  # write them to Redis, and Ruby's JSON reads them as they are.
  {
    "a key that is not UTF-8" => [%(["ORD-\xFF"]), "{{ key }} is not valid UTF-8"],
    "details that are not UTF-8" => [%(["ORD-1001",{"to":"\xFF"}]), "the details hold a string that is not valid UTF-8"]
  }.each do |problem, (args, error)|
    it "refuses #{problem}, written raw to the queue; the dead set's entry is JSON still" do
      outcome, log = logged { queue.deliver_json(raw_message(args)) }

      expect_refused(outcome, log, error, refused)
      expect(dead.first.item["args"].first).to include('\\xFF') if LIVE # an excerpt, the bytes escaped
    end
  end

  it "logs a bounded excerpt of a message of 5 MB, and keeps no more in the dead set" do
    outcome, log = logged { queue.deliver_raw(["ORD-HUGE", { "blob" => "x" * 5_000_000 }]) }

    expect_refused(outcome, log, "details are 5000011 bytes as JSON", refused)
    line = log.lines.grep(/{{ c.job_type }} refused/).first
    expect(line.bytesize).to be < 1000
    expect(line).to match(/\.\.\. \(50000\d\d characters\): details are/)
    expect(dead.first.value.bytesize).to be < 2000 if LIVE
  end

  if LIVE
    # Ruby's JSON does not read a lone surrogate; Sidekiq's processor puts a job it cannot read in the dead set
    # as it came, before any middleware or job runs. The messages around it are performed.
    it "leaves a job whose JSON holds a lone surrogate in the dead set, and loses no other message" do
      before = queue.push("ORD-1001")
      raw = raw_message('["ORD-\\ud800"]')
      queue.push_json(raw)
      after = queue.push("ORD-1002")

      expect([queue.wait_for(before), queue.wait_for(after)]).to eq(%w[returned returned])
      Timeout.timeout(20) { sleep 0.05 until dead.any? }
      expect(dead.map(&:value)).to eq([raw])
      expect([record("ORD-1001"), record("ORD-1002"), records_count]).to eq(["completed", "completed", 2])
      expect(effects.count).to eq(2)
      expect(queue.leftovers).to eq(queued: 0, scheduled: 0, retries: 0, dead: 1)
    end
  end
end
