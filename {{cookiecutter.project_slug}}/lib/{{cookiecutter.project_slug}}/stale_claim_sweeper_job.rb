{%- from "replay_matrix.jinja" import kind, policy with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
# frozen_string_literal: true

module {{ mod }}
  # Applies the stale-claim policy to claims older than the lease; this kit's policy is `{{ c.stale_claim_policy }}`:
  # {{ policy.short }}.
  # Open-source Sidekiq loses the job of a worker killed mid-run (no retry, no dead entry), so no redelivery
  # ever meets its claim: without this sweep the claim would wait forever.
  #
  # It also sends again the operations still queued RESEND_QUEUED_AFTER_SECONDS (the lease unless set) after
  # {{ job }}.enqueue sent them: a message that a killed worker took before its claim, or that
  # Redis lost, is sent again with the details its record keeps; the claim makes a copy that was not lost a
  # harmless duplicate.
  #
  # Schedule it more often than the lease, with sidekiq-cron, Sidekiq Enterprise's periodic jobs, or cron
  # running `rake {{ c.project_slug }}:sweep`.
  class StaleClaimSweeperJob
    include Sidekiq::Job

    # The next scheduled sweep is the retry.
    sidekiq_options queue: "default", retry: false

    # A sweep reads BATCH stale claims at a time and goes on while it finds a full batch, for at most
    # BUDGET_SECONDS (shorter than any sensible schedule: the next sweep goes on from the oldest claim left).
    # Each claim is settled by its own guarded statement, so no lock outlives one claim; a batch is shared by
    # THREADS threads, each on a connection of its own, so that their commits overlap.
    BATCH = 100
    BUDGET_SECONDS = 60
{%- if kind.one_transaction %}
    # One: each claim's transaction takes a connection from the app's pool, which other jobs share.
    THREADS = 1
{%- else %}
    THREADS = 4
{%- endif %}

    def perform
      handled = StaleClaimSweeperJob.sweep
      resent = StaleClaimSweeperJob.resend_queued
      logger.info("{{ c.job_type }} sweep: #{handled} stale claim(s) handled, " \
                  "#{resent} queued operation(s) sent again")
    end

    # The number of queued operations it sent again, BATCH at a time, for at most BUDGET_SECONDS. Each record's
    # claimed_at moves to now before its message goes, so the next sweep leaves it alone for as long again, and
    # two sweeps at once never send one twice.
    def self.resend_queued(batch: BATCH, budget: BUDGET_SECONDS)
      after = {{ mod }}.resend_queued_after
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + budget
      sent = 0
      loop do
        due = {{ mod }}.claims.resend_queued(after: after, limit: batch)
        due.each { |key, details| {{ job }}.push(key, details) }
        sent += due.size
        break if due.size < batch || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      end
      sent
    end

    # The number of stale claims it handled. A failure on one claim is logged and the sweep goes on.
    def self.sweep(batch: BATCH, budget: BUDGET_SECONDS)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + budget
      work = Queue.new
      done = Queue.new
      threads = Array.new(THREADS) { Thread.new { sweep_from(work, done) } }
      handled = {}
      from = nil
      loop do
        stale = {{ mod }}.claims.stale_claims(limit: batch, from: from)
        # A batch starts at the last one's claimed_at, so that a claim left stale (its handling failed) is not
        # met again and again; the ones it shares that instant with come back once, and are passed over.
        fresh = stale.reject { |key, _token, _claimed_at| handled.key?(key) }
        fresh.each { |claim| work << claim }
        fresh.size.times { handled[done.pop] = true }
        break if stale.size < batch || fresh.empty? || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

        from = stale.last.last
      end
      handled.size
    ensure
      work.close
      threads.each(&:join)
    end

    # A sweeping thread: takes claims until the sweep is over, then gives back what it took (a pool connection,
    # which the effect's code may use, and its own connection).
    def self.sweep_from(work, done)
      while (key, token, = work.pop)
        begin
          sweep_one(key, token)
        ensure
          done << key
        end
      end
    ensure
      {{ mod }}.connection_pool.release_connection
      Claims::Session.close
    end

    def self.sweep_one(key, token)
      {{ job }}.new.sweep_stale(key, token)
    rescue Claims::PayloadConflict => e
      Sidekiq.logger.error(e.message)
    rescue StandardError => e
      # The effect failed and released the claim: the job, with Sidekiq's retries, takes it from here.
      Sidekiq.logger.error(
        "{{ c.job_type }} #{key}: the sweep failed (#{e.class}: #{e.message}); enqueued the job"
      )
      {{ job }}.perform_async(key)
    end
    private_class_method :sweep_from, :sweep_one
  end
end
