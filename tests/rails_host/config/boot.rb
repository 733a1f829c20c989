# frozen_string_literal: true

# No Bundler: the app runs on the gems of the Ruby stack it is tested on.
