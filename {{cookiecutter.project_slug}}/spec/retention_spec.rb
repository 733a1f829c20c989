{%- from "replay_matrix.jinja" import rb -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
{%- set t = c.record_table -%}
# frozen_string_literal: true

require "open3"
require "socket"

# Retention: completed records older than DAYS are deleted, in batches; an age that a redelivery could outlast
# is refused with one line naming the minimum, and nothing is deleted.
RSpec.describe "retention of completed records" do
  let(:claims) { {{ mod }}.claims }
  let(:job) { {{ mod }}::{{ job }} }
  let(:connection) { ActiveRecord::Base.connection }

  # A record of `key` in `status`, claimed and (if completed) completed `days_ago` days ago.
  def record_of(key, status, days_ago)
    at = if connection.adapter_name == "PostgreSQL"
           "clock_timestamp() - make_interval(days => #{days_ago})"
         else
           "julianday('now') - #{days_ago}"
         end
    connection.execute(<<~SQL)
      INSERT INTO {{ t }} (job_type, operation_key, payload_fingerprint, status, claim_token, claimed_at, completed_at)
      VALUES ('{{ c.job_type }}', #{connection.quote(key)}, 'fingerprint', '#{status}', 'token', #{at},
              #{status == 'completed' ? at : 'NULL'})
    SQL
  end

  def keys
    connection.select_values("SELECT operation_key FROM {{ t }} ORDER BY operation_key")
  end

  it "takes the redelivery window from the most retries a message may get: Sidekiq's default 25, about 20.4 days" do
    default = Class.new { include Sidekiq::Job }
    more = Class.new do
      include Sidekiq::Job

      sidekiq_options retry: 30
    end

    expect({{ mod }}::Claims.redelivery_window(default, 600) / 86_400.0).to be_within(0.05).of(20.45)
    expect({{ mod }}::Claims.retries(more)).to eq(30)
    # fewer of the job's own (8) do not shorten it: a message pushed by the class's name gets Sidekiq's 25
    expect(job.get_sidekiq_options["retry"]).to be < 25
    expect({{ mod }}::Claims.retries(job)).to eq(25)
    # the key on a line of its own: it may fill one
    key = {{ rb(c.example_key) }}
    by_name = Sidekiq::Client.new.normalize_item("class" => job.name, "args" => [key])
    expect(by_name["retry"]).to be(true)
  end

  it "deletes the completed records older than DAYS, in batches, and keeps the rest" do
    (1..7).each { |n| record_of("OLD-#{n}", "completed", 40) }
    record_of("YOUNG", "completed", 5)
    record_of("HELD", "held", 40)
    record_of("CLAIMED", "claimed", 40)

    expect(claims.retain(days: 30, job: job, batch: 3)).to eq(7)
    expect(keys).to eq(%w[CLAIMED HELD YOUNG])
    expect(claims.retain(days: 30, job: job, batch: 3)).to eq(0)
  end

  it "refuses DAYS not longer than the job's redelivery window, naming the minimum, and deletes nothing" do
    record_of("OLD", "completed", 40)
    lease = {{ mod }}::LEASE_SECONDS
    window = {{ mod }}::Claims.redelivery_window(job, lease) / 86_400.0
    minimum = ->(error) { error.message[/the minimum is DAYS=([\d.]+)\z/, 1].to_f }

    [0, window.floor(4)].each do |days|
      expect { claims.retain(days: days, job: job) }.to raise_error(ArgumentError) do |error|
        expect(error.message).to match(/\A{{ c.job_type }}: DAYS=\S+ is refused: .* minimum is DAYS=/)
        expect(minimum.call(error)).to be > window
      end
    end
    expect(keys).to eq(%w[OLD])
    expect(claims.retain(days: window.ceil(2), job: job)).to eq(1)
  end

  # Left out inside a host app (REPLAY_HOST_APP), which runs its own rake.
  it "runs as `rake {{ c.project_slug }}:retain DAYS=N`: one line when refused, the count when done",
     unless: HOST_APP do
    record_of("OLD", "completed", 40)
    rake = lambda do |*args|
      task = "{{ c.project_slug }}:retain"
      Open3.capture3(RbConfig.ruby, "-S", "rake", task, *args, chdir: File.join(__dir__, ".."))
    end

    _, refused, status = rake.call("DAYS=0")
    expect(status.exitstatus).to eq(1)
    expect(refused.lines.size).to eq(1)
    expect(refused).to match(/DAYS=0 is refused: .* the minimum is DAYS=[\d.]+$/)
    expect(keys).to eq(%w[OLD])

    done, _, status = rake.call("DAYS=30")
    expect(status).to be_success
    expect(done).to eq("1 completed record(s) of {{ c.job_type }} older than 30 days deleted\n")
    expect(keys).to be_empty
  end

  # Each task on a database it cannot reach (nothing listens on the port): one line, exit status 2, no backtrace.
  it "runs every person's task to one line when the database cannot be reached", unless: HOST_APP do
    # a port bound and never listened on refuses every connection, and no other process can take it meanwhile
    closed = Socket.new(:INET, :STREAM)
    closed.bind(Addrinfo.tcp("127.0.0.1", 0))
    env = { "DATABASE_URL" => "postgresql://nobody@127.0.0.1:#{closed.local_address.ip_port}/down" }
    %w[status sweep held:list held:resolutions].each do |name|
      task = "{{ c.project_slug }}:#{name}"
      out, err, status = Open3.capture3(env, RbConfig.ruby, "-S", "rake", task, chdir: File.join(__dir__, ".."))
      expect(status.exitstatus).to eq(2), err
      expect(out).to eq("")
      expect(err.lines.size).to eq(1), err
      expect(err).to start_with("#{task}: the database cannot be reached (")
    end
  ensure
    closed&.close
  end
end
