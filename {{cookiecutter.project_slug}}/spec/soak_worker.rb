{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

# What a worker of the soak loads (`rake {{ c.project_slug }}:soak` starts
# `sidekiq -r ./spec/soak_worker.rb`): the kit, as `sidekiq -r ./lib/{{ c.project_slug }}.rb` loads it,
# and one fault more, first in the server middleware: the worker kills itself right after taking a share
# SOAK_KILL_AFTER_TAKE of its messages while the file SOAK_CHAOS exists
# ({{ mod }}::Soak::KillAfterTake). Only the soak loads this.
require_relative "../lib/{{ c.project_slug }}"
require_relative "soak"

Sidekiq.configure_server do |config|
  share = Float(ENV.fetch("SOAK_KILL_AFTER_TAKE"))
  switch = ENV.fetch("SOAK_CHAOS")
  config.server_middleware { |chain| chain.prepend {{ mod }}::Soak::KillAfterTake, share, switch }
end
