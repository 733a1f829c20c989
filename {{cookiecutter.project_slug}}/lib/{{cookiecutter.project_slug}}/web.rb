{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

require "erb"
require "sidekiq/web"

module {{ mod }}
  # A tab of Sidekiq Web, through Sidekiq's own extension API: the operations of the job that wait for a person
  # (held, and failed past Sidekiq's retries), and the two decisions a person makes on one, as the rake task
  # `held:resolve` makes them: done (the effect happened), or one more attempt (queued again and sent). The forms
  # carry Sidekiq Web's CSRF protection.
  #
  # The app says who may decide (config/routes.rb, before mounting Sidekiq::Web):
  #
  #   {{ mod }}::Web.add_tab(resolver: ->(env) { env["warden"]&.user&.email })
  #
  # `resolver` gets the request's Rack env and answers with the name of the signed-in user who may resolve held
  # work, or nil: then the tab only lists. Each decision is recorded with that name as `sidekiq-web:<name>`, and
  # logged.
  module Web
    # the tab's label and route, under Sidekiq Web's own path
    TAB = "{{ c.job_type }}: held"
    ROUTE = "{{ c.project_slug|replace("_", "-") }}-held"

    # Rendered in Sidekiq's layout, with its helpers (h, root_path, csrf_tag) and the page's values as locals.
    PAGE = <<~HTML
      <h3><%= h tab_label %></h3>
      <% if said %><div class="alert alert-info" id="said"><%= h said %></div><% end %>
      <% if waiting.empty? %>
        <p>Nothing waits for a person.</p>
      <% else %>
        <table class="table table-striped table-bordered table-hover" id="held-operations">
          <tr><th>key</th><th>status</th><th>attempt</th><th>claimed at (UTC)</th><th>note</th><th>decision</th></tr>
          <% waiting.each do |op| %>
            <tr>
              <td><%= h op.key %></td><td><%= h op.status %></td><td><%= op.attempt %></td>
              <td><%= h op.claimed_at %></td><td><%= h op.note %></td>
              <td>
                <% if decider %>
                  <form method="post" action="<%= root_path %><%= tab_route %>">
                    <%= csrf_tag %>
                    <input type="hidden" name="key" value="<%= h op.key %>">
                    <input type="text" name="why" placeholder="why" required>
                    <button class="btn btn-primary btn-xs" name="decision" value="done">Done</button>
                    <button class="btn btn-danger btn-xs" name="decision" value="again">One more attempt</button>
                  </form>
                <% else %>
                  for a person who may resolve it
                <% end %>
              </td>
            </tr>
          <% end %>
        </table>
      <% end %>
    HTML

    class << self
      attr_accessor :resolver

      # Adds the tab to Sidekiq Web, in the way this Sidekiq asks (8: Web.configure; 6 and 7: Web.register).
      def add_tab(resolver:)
        self.resolver = resolver
        if Sidekiq::Web.respond_to?(:configure)
          Sidekiq::Web.configure { |config| config.register(self, name: ROUTE, tab: TAB, index: ROUTE) }
        else
          Sidekiq::Web.register(self)
          Sidekiq::Web.tabs[TAB] = ROUTE
        end
      end

      # Sidekiq's extension API: the tab's routes, on Sidekiq Web's application.
      def registered(app)
        app.get("/#{ROUTE}") { Web.page(self) }
        app.post("/#{ROUTE}") { Web.decide(self) }
      end

      # The list, rendered by `action`, Sidekiq Web's request, in Sidekiq's layout.
      def page(action, said = nil)
        waiting = {{ mod }}.claims.held
        decider = resolver&.call(action.env)
        action.erb(PAGE, locals: { tab_label: TAB, tab_route: ROUTE, waiting: waiting, decider: decider, said: said })
      end

      # A person's decision, sent by the tab's form: refused (403) unless the app names a user who may decide.
      def decide(action)
        user = resolver&.call(action.env)
        return action.halt(403) unless user

        form = action.request.params
        done = form["decision"] == "done"
        jid = HeldOperations.resolve(form["key"].to_s, done: done, by: user, why: form["why"].to_s,
                                                       resolved_as: "sidekiq-web:#{user}")
        page(action, "#{form['key']}: #{HeldOperations.outcome(done, jid)} by #{user}")
      rescue ArgumentError => e
        page(action, e.message)
      end
    end
  end
end
