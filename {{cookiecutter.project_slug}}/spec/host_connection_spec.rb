{%- from "replay_matrix.jinja" import rb -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

require "open3"

# An app that connected ActiveRecord itself keeps its connection when it loads the kit: the kit's records land
# in the app's database, and the app's connection is still the one it made. Run in a process of its own, an
# app with its own table and DATABASE_URL unset (the kit on its own would fall back to a file in db/).
RSpec.describe "the kit inside an app that has its own connection" do
  let(:app_database) { File.join(WORK_DIR, "app.sqlite3") }
  let(:key) { {{ rb(c.example_key) }} }
  let(:app) do
    <<~RUBY
      require "active_record"
      ActiveRecord::Base.establish_connection(adapter: "sqlite3", database: #{app_database.inspect})
      ActiveRecord::Base.connection.create_table(:customers) { |t| t.string :name }
      require "./lib/{{ c.project_slug }}"
      ActiveRecord::Migration.verbose = false
      {{ mod }}.migrate!
      {{ mod }}.claims.claim(#{key.inspect}, "fingerprint")
      puts ActiveRecord::Base.connection_db_config.database
      puts ActiveRecord::Base.connection.select_value("SELECT COUNT(*) FROM {{ c.record_table }}")
      puts ActiveRecord::Base.connection.table_exists?("customers")
    RUBY
  end

  # In a Rails host (REPLAY_HOST_APP) the suite runs in that app's bundle, which need not hold sqlite3: this
  # other app runs outside it.
  def run_app
    run = -> { Open3.capture2e({ "DATABASE_URL" => nil }, RbConfig.ruby, "-e", app, chdir: File.join(__dir__, "..")) }
    HOST_APP && defined?(Bundler) ? Bundler.with_original_env(&run) : run.call
  end

  it "uses the app's connection and never replaces it" do
    output, status = run_app

    expect(status).to be_success, output
    expect(output.lines.map(&:chomp)).to eq([app_database, "1", "true"])
  end
end
