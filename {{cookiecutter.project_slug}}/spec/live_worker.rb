{%- set c = cookiecutter -%}
# frozen_string_literal: true

# What a live worker process loads in the suite: the kit (or the Rails app that holds it, with REPLAY_HOST_APP),
# plus the replay points the spec steers it with.
#   sidekiq -r ./spec/live_worker.rb
if ENV["REPLAY_HOST_APP"]
  # What `sidekiq -r <app>` does for a Rails app: Sidekiq's Rails integration first (each job runs in Rails'
  # executor), then the app.
  require "rails"
  require "sidekiq/rails"
  require File.expand_path("config/environment", ENV.fetch("REPLAY_HOST_APP"))
else
  require_relative "../lib/{{ c.project_slug }}"
end
require "json"
require_relative "replay_points"

ReplayPoints.dir = ENV.fetch("REPLAY_POINTS_DIR")
ReplayPoints.on_crash = :wait_to_be_killed

# Notes each finished job, and whether an error escaped it (only an escaped error is retried by Sidekiq).
class FinishedJobs
  def call(_job, message, _queue)
    yield
    ReplayPoints.finish(message["jid"], "returned")
  rescue StandardError
    ReplayPoints.finish(message["jid"], "raised")
    raise
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.add FinishedJobs }
  config.on(:startup) do
    # Sidekiq 7 and later keep settings in the config; 6.4 in Sidekiq.options.
    concurrency = config.respond_to?(:concurrency) ? config.concurrency : Sidekiq.options[:concurrency]
    worker = { concurrency: concurrency, pool: {{ c.project_slug.split("_")|map("capitalize")|join }}.connection_pool.size }
    ready = File.join(ReplayPoints.dir, "ready-#{Process.pid}")
    File.write("#{ready}.tmp", JSON.generate(worker))
    File.rename("#{ready}.tmp", ready) # whole, or not there yet
  end
end
