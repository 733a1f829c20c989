{%- from "replay_matrix.jinja" import rb -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
# frozen_string_literal: true

require "shellwords"

# The kit's tasks, namespaced so that they never shadow an app's own. In a Rails app this file is
# lib/tasks/{{ c.project_slug }}.rake and `:environment` boots the app; on its own, the kit's Rakefile
# loads it.
namespace :{{ c.project_slug }} do
  desc "Send {{ c.job_type }} for one {{ c.operation_key_name }} (its record first, as queued): " \
       "KEY=<{{ c.operation_key_name }}>"
  task enqueue: :environment do |task|
    {{ mod }}::DatabaseCheck.one_line_on_failure(task) do
      key = ENV.fetch("KEY") do
        example = Shellwords.escape({{ rb(c.example_key) }})
        abort "KEY is missing: pass the {{ c.operation_key_name }} to enqueue, e.g. KEY=#{example}"
      end
      begin
        {{ mod }}.check_queue
      rescue {{ mod }}::QueueUnreachable => e
        warn "#{task.name}: #{e.message}; nothing sent, nothing recorded"
        exit 2
      end
      jid = {{ mod }}::{{ job }}.enqueue(key)
      # nil: the key has a record already; nothing was written or sent
      if jid
        puts "enqueued {{ c.job_type }} #{key}: jid #{jid}"
      else
        puts "{{ c.job_type }} #{key}: known, not sent again"
      end
    rescue {{ mod }}::Claims::PayloadConflict,
           {{ mod }}::{{ job }}::BadMessage => e
      abort e.message
    rescue {{ mod }}::QueueUnreachable => e
      # Redis went away between the check and the push: the record, written first, stays queued
      warn "#{task.name}: #{e.message}; #{ {{- mod -}} .queued_for_the_sweeper}"
      exit 2
    end
  end

  desc "Apply the stale-claim policy ({{ c.stale_claim_policy }}) to claims older than the lease ({{ c.lease_seconds }} s), " \
       "and send again what is queued past RESEND_QUEUED_AFTER_SECONDS"
  task sweep: :environment do |task|
    {{ mod }}::DatabaseCheck.one_line_on_failure(task) do
      swept = {{ mod }}::StaleClaimSweeperJob.sweep
      puts "#{swept} stale claim(s) of {{ c.job_type }} handled"
      sent = {{ mod }}::StaleClaimSweeperJob.resend_queued
      puts "#{sent} queued operation(s) of {{ c.job_type }} sent again"
    end
  end

  desc "Status of {{ c.job_type }}: the count and oldest age of each state; " \
       "exits 1 when something waits for a person or sits past its time"
  task status: :environment do |task|
    {{ mod }}::DatabaseCheck.one_line_on_failure(task) do
      exit({{ mod }}::HeldOperations.status ? 0 : 1)
    end
  end

  desc "Delete the completed records of {{ c.job_type }} older than DAYS=<days>, " \
       "which must exceed the job's redelivery window"
  task retain: :environment do |task|
    {{ mod }}::DatabaseCheck.one_line_on_failure(task) do
      given = ENV.fetch("DAYS") do
        abort "DAYS is missing: pass the age in days of the completed records to delete, e.g. DAYS=90"
      end
      days = Float(given, exception: false) or abort "DAYS must be a number of days, e.g. DAYS=30; got #{given.inspect}"
      deleted = {{ mod }}.claims.retain(
        days: days, job: {{ mod }}::{{ job }}
      )
      puts "#{deleted} completed record(s) of {{ c.job_type }} older than #{given} days deleted"
    rescue ArgumentError => e
      abort e.message
    end
  end

  namespace :held do
    desc "List the operations of {{ c.job_type }} that wait for a person: " \
         "held, and failed past Sidekiq's retries"
    task list: :environment do |task|
      {{ mod }}::DatabaseCheck.one_line_on_failure(task) do
        {{ mod }}::HeldOperations.list
      end
    end

    desc "Resolve a held or failed operation: KEY=<key> DONE=yes|no BY=<who> WHY=<why> (no: send it again for one " \
         "more attempt)"
    task resolve: :environment do |task|
      {{ mod }}::DatabaseCheck.one_line_on_failure(task) do
        key = ENV.fetch("KEY") do
          example = Shellwords.escape({{ rb(c.example_key) }})
          abort "KEY is missing: pass the {{ c.operation_key_name }} of a held or failed operation " \
                "({{ c.project_slug }}:held:list shows them), e.g. KEY=#{example}"
        end
        done = { "yes" => true, "no" => false }.fetch(ENV.fetch("DONE", "")) do
          abort "DONE must be yes (the effect happened) or no (release it for one more attempt)"
        end

        who, why = ENV.values_at("BY", "WHY")
        jid = {{ mod }}::HeldOperations.resolve(key, done: done, by: who, why: why)
        puts "{{ c.job_type }} #{key}: #{ {{- mod -}} ::HeldOperations.outcome(done, jid)}"
      rescue ArgumentError => e
        abort e.message
      end
    end

    desc "Every resolution of {{ c.job_type }} by a person, oldest first: of KEY=<key>, or of every key"
    task resolutions: :environment do |task|
      {{ mod }}::DatabaseCheck.one_line_on_failure(task) do
        {{ mod }}::HeldOperations.resolutions(ENV.fetch("KEY", nil))
      end
    end
  end
end
