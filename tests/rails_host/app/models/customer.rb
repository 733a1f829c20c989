# frozen_string_literal: true

class Customer < ApplicationRecord
end
