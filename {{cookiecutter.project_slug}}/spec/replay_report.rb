# frozen_string_literal: true

require "json"
require "mustache"
require "socket"
require "yaml"

# The sign-off reports, written after every run of the replay suite: replay-report.json, and from it
#   replay-report.html  for the client: the verdict, the policy, the seven cases, where it ran, the sign-off
#   replay-report.md    the same, for a pull request or an email
#   replay-junit.xml    one test case per row, for any CI
# Each is rendered from its Mustache template in report/, which the Python kits share: the words come from the
# template that wrote POLICY.md; this file only adds what the templates cannot compute. The last soak
# (replay-soak.json, from `rake <kit>:soak`) shows in them too, whichever of the two ran last: the soak renders
# them again from replay-report.json.
module ReplayReport
  KIT_ROOT = File.expand_path("..", __dir__)
  REPORTS = %w[replay-report.html replay-report.md replay-junit.xml].freeze
  CASES = (1..7)
  # The libraries whose versions the report names, by the constant that holds each version.
  LIBRARIES = { "ActiveRecord" => "ActiveRecord::VERSION::STRING", "Rails" => "Rails::VERSION::STRING",
                "redis" => "Redis::VERSION", "redis-client" => "RedisClient::VERSION", "pg" => "PG::VERSION",
                "sqlite3" => "SQLite3::VERSION", "RSpec" => "RSpec::Core::Version::STRING" }.freeze

  class << self
    # The rows the replay spec fills in, and when the run started.
    def rows
      @rows ||= []
    end

    def started_at
      @started_at ||= now
    end

    def now
      Time.now.utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    end

    # Writes replay-report.json and the three reports from it.
    def write(report)
      File.write(File.join(KIT_ROOT, "replay-report.json"), "#{JSON.pretty_generate(report)}\n")
      render(JSON.parse(JSON.generate(report)))
    end

    # The three reports again from replay-report.json, with the soak that just ran.
    def rerender
      render(JSON.parse(File.read(File.join(KIT_ROOT, "replay-report.json"))))
    end

    # The report, plus each case by its number ("case5") with its status, the verdict's parts, and the last
    # soak under "soak" when there is one: a soak that failed fails the verdict too.
    def view(report)
      rows = report.fetch("rows", []).to_h { |row| [row["case"], row] }
      cases = CASES.to_h { |number| ["case#{number}", case_view(number, rows[number])] }
      soak = soak_of(report)
      report.merge(cases).merge(verdict(report, cases.values, soak_failed: soak ? !soak["passed"] : false),
                                "soak" => soak)
    end

    # replay-soak.json, when a soak ran here with the report's answers (not before a change of policy), else nil.
    def soak_of(report)
      path = File.join(KIT_ROOT, "replay-soak.json")
      return unless File.exist?(path)

      soak = JSON.parse(File.read(path))
      answers = %w[queue_system stale_claim_policy effect_kind]
      soak if soak.values_at(*answers) == report.values_at(*answers)
    end

    def machine = Socket.gethostname

    # Where the suite ran, as the running process sees it, and the broker's settings the guarantee rests on.
    def environment(broker:, settings:, host_app:)
      [
        ["Queue system", "Sidekiq #{Sidekiq::VERSION}"], ["Broker", broker], ["Database", database_server],
        ["Language", "Ruby #{RUBY_VERSION} (#{RUBY_PLATFORM})"], ["Broker settings", settings],
        ["Libraries", libraries], ["Host application", host_app || "none: the kit on its own"],
        ["Template", TemplateOrigin.describe(KIT_ROOT)]
      ].map { |name, value| { name:, value: } }
    end

    private

    # The verdict's parts, from the cases and the soak.
    def verdict(report, cases, soak_failed:)
      unpassed = cases.reject { |row| row["status"] == "passed" }
      { "failed_cases" => unpassed, "signed_off" => unpassed.empty? && !report["error"] && !soak_failed,
        "failure_count" => cases.count { |row| row["failed"] } + (soak_failed ? 1 : 0),
        "error_count" => cases.count { |row| row["not_run"] } }
    end

    def render(report)
      filled = view(report)
      REPORTS.each do |name|
        template = File.read(File.join(KIT_ROOT, "report", "#{name}.mustache"))
        File.write(File.join(KIT_ROOT, name), Mustache.render(template, filled))
      end
    end

    def database_server
      connection = ActiveRecord::Base.connection
      if connection.adapter_name == "PostgreSQL"
        "PostgreSQL #{connection.select_value('SHOW server_version')}"
      else
        "SQLite #{connection.select_value('SELECT sqlite_version()')}"
      end
    end

    def libraries
      LIBRARIES.filter_map { |name, version| "#{name} #{Object.const_get(version)}" if Object.const_defined?(version) }
               .join(", ")
    end

    def case_view(number, row)
      status = if row.nil?
                 "not run"
               elsif row["passed"]
                 "passed"
               else
                 "failed"
               end
      (row || { "case" => number }).merge(
        "status" => status, "status_class" => status.tr(" ", "-"), "failed" => status == "failed",
        "not_run" => status == "not run", "has_timeline" => !(row || {}).fetch("timeline", []).empty?
      )
    end
  end
end

# Where the template that made this kit came from: the commit copier or cruft recorded, when either did, and
# in words when that commit cannot be found in a template on this machine.
module TemplateOrigin
  module_function

  def describe(kit_root)
    copier = File.join(kit_root, ".copier-answers.yml")
    cruft = File.join(kit_root, ".cruft.json")
    if File.exist?(copier)
      answers = YAML.safe_load_file(copier)
      source, commit = answers.values_at("_src_path", "_commit")
    elsif File.exist?(cruft)
      source, commit = JSON.parse(File.read(cruft)).values_at("template", "commit")
    else
      return "not recorded (generated by cookiecutter; copier and cruft record it)"
    end
    missing = commit_missing(kit_root, source.to_s, commit.to_s)
    missing ? "#{source}, #{missing}" : "#{source} at #{commit}"
  end

  # Why the recorded commit cannot be shown, in words; nil when it can. A template in a folder here (the path as
  # recorded, from the kit's folder) is asked for the commit; a template elsewhere (a URL) cannot be asked.
  def commit_missing(kit_root, source, commit)
    return if source.include?("://") || source.start_with?("gh:", "gl:", "git@")

    folder = File.expand_path(source, kit_root)
    unless File.directory?(folder)
      return "at a commit that cannot be checked: no template is at that path from this kit's folder"
    end
    return if system("git", "-C", folder, "cat-file", "-e", "#{commit}^0", out: File::NULL, err: File::NULL)

    "at a commit it does not hold: the template had uncommitted changes when this kit was made (copier then " \
      "records a commit of its own making), or the commit is gone"
  end
end
