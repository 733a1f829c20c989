# frozen_string_literal: true

require "sidekiq/web"

Rails.application.routes.draw do
  get "sign_in", to: "sessions#create"
  # Sidekiq Web for the people signed in, as Devise's `authenticate` would have it
  constraints(->(request) { request.session[:user].present? }) do
    mount Sidekiq::Web => "/sidekiq"
  end
end
