# frozen_string_literal: true

require_relative "boot"
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "sidekiq"

module HostApp
  class Application < Rails::Application
    config.load_defaults Rails::VERSION::STRING.to_f
    config.root = File.expand_path("..", __dir__)
    # As in production: every class loaded at boot, none reloaded.
    config.eager_load = true
    config.cache_classes = true
    config.secret_key_base = "host-app-for-tests"
    config.logger = Logger.new(File.expand_path("../log/host.log", __dir__))
  end
end
