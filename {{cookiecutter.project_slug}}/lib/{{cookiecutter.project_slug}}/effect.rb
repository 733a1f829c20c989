{%- from "replay_matrix.jinja" import description with context -%}
{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
# frozen_string_literal: true

{% if c.effect_kind == "external_no_reference" -%}
require "net/smtp"
{%- elif c.effect_kind == "external_with_reference" -%}
require "json"
require "net/http"
{%- else -%}
require "json"
{%- endif %}

module {{ mod }}
  # The effect, the file to edit:
  # {{ description }}.
  # The job around it claims the {{ c.operation_key_name }} first and marks it completed after, so the effect
  # itself stays plain.
  module Effect
    module_function

    # What the effect needs for this key. The message carries only the key, so this is where the details
    # are loaded (from your orders, say). The job stores their fingerprint with the claim: if the same key
    # later comes with other details, that is reported as a conflict and nothing is done.
    def details_for({{ c.operation_key_name }})
      { "to" => "customer@example.com", "subject" => "Your order #{ {{- c.operation_key_name -}} } is confirmed" }
    end
{%- if c.effect_kind == "external_no_reference" %}

    # Sends the email through SMTP_HOST:SMTP_PORT. Raise when it was not sent: the job then releases the
    # claim and Sidekiq retries. The provider takes no reference, so nobody can ask it later what it sent.
    def perform({{ c.operation_key_name }}, details)
      mail = <<~MAIL
        From: #{sender}
        To: #{details['to']}
        Subject: #{header_text(details['subject'])}
        MIME-Version: 1.0
        Content-Type: text/plain; charset=UTF-8
        Content-Transfer-Encoding: 8bit

        Thank you for your order #{ {{- c.operation_key_name -}} }.
      MAIL
      Net::SMTP.start(ENV.fetch("SMTP_HOST", "localhost"), Integer(ENV.fetch("SMTP_PORT", "25"))) do |smtp|
        smtp.send_message(mail, sender, details["to"])
      end
    end

    def sender
      ENV.fetch("MAIL_FROM", "orders@example.com")
    end

    # A header's text as RFC 2047 has it: an encoded word when it is not plain ASCII (a key in any script).
    def header_text(text)
      text.ascii_only? ? text : "=?UTF-8?B?#{[text].pack('m0')}?="
    end
{%- elif c.effect_kind == "external_with_reference" %}

    # Hands the message to the provider with the key as its reference. Raise when it was not accepted: the
    # job then releases the claim and Sidekiq retries.
    def perform({{ c.operation_key_name }}, details)
      message = JSON.generate(details.merge("reference" => {{ c.operation_key_name }}))
      response = provider.post("/messages", message, "Content-Type" => "application/json")
      return if response.is_a?(Net::HTTPSuccess)

      raise "provider refused #{ {{- c.operation_key_name -}} }: HTTP #{response.code}"
    end

    # Asks the provider whether it holds a message with this reference (the lookup policy asks before it
    # performs the effect again).
    def performed?({{ c.operation_key_name }})
      response = provider.get("/messages/#{URI.encode_www_form_component({{ c.operation_key_name }})}")
      return false if response.is_a?(Net::HTTPNotFound)
      return true if response.is_a?(Net::HTTPSuccess)

      raise "provider lookup of #{ {{- c.operation_key_name -}} } failed: HTTP #{response.code}"
    end

    # PROVIDER_URL is the provider's HTTP API.
    def provider
      uri = URI(ENV.fetch("PROVIDER_URL", "http://localhost:8025"))
      Net::HTTP.new(uri.host, uri.port).tap do |http|
        http.use_ssl = uri.scheme == "https"
        http.open_timeout = 5
        http.read_timeout = 30
      end
    end
{%- else %}

    # Writes the effect's row in the claim's own transaction (the connection the job holds for it): the claim,
    # this row and the completion commit together or not at all.
    def perform({{ c.operation_key_name }}, details)
      {{ mod }}.with_connection do |connection|
        key, payload = [{{ c.operation_key_name }}, JSON.generate(details)].map { |value| connection.quote(value) }
        # execute, not exec_insert: that asks the database for the table's primary key first, each time
        connection.execute(<<~SQL)
          INSERT INTO {{ c.job_type }}_effects (operation_key, payload, performed_at)
          VALUES (#{key}, #{payload}, #{ {{- mod }}.claims.now_sql})
        SQL
      end
    end
{%- endif %}
  end
end
