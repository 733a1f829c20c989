{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

# Installs this kit into the Rails app that runs it, where a Rails developer looks for each part, or brings an
# app that holds an earlier revision of it up to this one:
#
#   cd your_app && bin/rails runner path/to/{{ c.project_slug }}/install_into_rails.rb
#
#   app/sidekiq/{{ c.project_slug }}.rb and app/sidekiq/{{ c.project_slug }}/:
#     the job, the sweeper, the claims, the effect
#   lib/tasks/{{ c.project_slug }}.rake: the tasks {{ c.project_slug }}:enqueue, :sweep, :status,
#     :held:list, :held:resolve, :held:resolutions
#   db/migrate/<now>_create_{{ c.record_table }}.rb,
#     <now + 1 s>_index_claimed_{{ c.record_table }}.rb,
#     <now + 2 s>_queued_and_failed_{{ c.record_table }}.rb and
#     <now + 3 s>_resolutions_{{ c.record_table }}.rb:
#     the kit's migrations in their order, each as Migration[the app's version]
#
# The kit then uses the app's ActiveRecord connection and Rails' autoloader. Run again (after `copier update`
# of the kit, say), it writes only what the app lacks or holds in an earlier revision: a migration the app does
# not have (its name is the kit's, after the app's own timestamp), and the kit's files that differ, but for the
# effect, the app's own once written. Run once more, it writes nothing.
require "fileutils"

kit = __dir__
app = Rails.root.to_s
copies = Dir[File.join(kit, "lib/{{ c.project_slug }}/*.rb")].to_h do |part|
  [part, File.join(app, "app/sidekiq/{{ c.project_slug }}", File.basename(part))]
end
copies[File.join(kit, "lib/{{ c.project_slug }}.rb")] =
  File.join(app, "app/sidekiq/{{ c.project_slug }}.rb")
copies[File.join(kit, "lib/{{ c.project_slug }}/tasks.rake")] =
  File.join(app, "lib/tasks/{{ c.project_slug }}.rake")
effect = File.join(app, "app/sidekiq/{{ c.project_slug }}/effect.rb")
# The kit's migrations (Dir[] sorts them) that the app has under no timestamp, by their name without it.
migrations = Dir[File.join(kit, "db/migrate/*.rb")].reject do |migration|
  Dir[File.join(app, "db/migrate/*_#{File.basename(migration).sub(/\A\d+_/, '')}")].any?
end

written = 0
copies.each do |source, target|
  next if File.exist?(target) && (target == effect || FileUtils.compare_file(source, target))

  verb = File.exist?(target) ? "updated" : "wrote"
  FileUtils.mkdir_p(File.dirname(target))
  FileUtils.cp(source, target)
  puts "#{verb} #{target.delete_prefix("#{app}/")}"
  written += 1
end
# Each a second after the last, and after every migration the app has: as Rails' generator numbers them.
version = ActiveRecord::Migration.current_version
taken = Dir[File.join(app, "db/migrate/*.rb")].map { |file| File.basename(file).to_i }
stamp = [Time.now.utc.strftime("%Y%m%d%H%M%S").to_i - 1, *taken].max
migrations.each do |migration|
  stamp += 1
  target = File.join(app, "db/migrate/#{stamp}_#{File.basename(migration).sub(/\A\d+_/, '')}")
  FileUtils.mkdir_p(File.dirname(target))
  File.write(target, File.read(migration).sub(/Migration\[[\d.]+\]/, "Migration[#{version}]"))
  puts "wrote #{target.delete_prefix("#{app}/")}"
  written += 1
end
# Earlier revisions copied the soak into the app; it runs from the kit's folder now (spec/soak.rb).
old_soak = File.join(app, "app/sidekiq/{{ c.project_slug }}/soak.rb")
if File.exist?(old_soak)
  File.delete(old_soak)
  puts "removed #{old_soak.delete_prefix("#{app}/")}: the soak runs from the kit's folder"
  written += 1
end
kit_effect = File.join(kit, "lib/{{ c.project_slug }}/effect.rb")
if File.exist?(effect) && !FileUtils.compare_file(kit_effect, effect)
  puts "kept app/sidekiq/{{ c.project_slug }}/effect.rb, the app's own: compare it with the kit's " \
       "lib/{{ c.project_slug }}/effect.rb"
end
if written.zero?
  puts "nothing to write: #{app} holds this revision of the kit"
else
  puts "next: bin/rails db:migrate, then schedule {{ mod }}::StaleClaimSweeperJob " \
       "(the kit's README says how)"
end
