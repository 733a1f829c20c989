# frozen_string_literal: true

# The app's sign-in, a stand-in for Devise's: who is signed in is a name in the session. (A GET that signs in is
# for the tests' browser only.)
class SessionsController < ActionController::Base
  def create
    session[:user] = params.require(:name)
    redirect_to params.fetch(:to, "/sidekiq")
  end
end
