# frozen_string_literal: true

require "json"
require "socket"
require "uri"

# A fake provider that is a real HTTP server on a free port: it takes messages with a reference
# (POST /messages) and answers lookups (GET /messages/<reference>) from what it really received. The suite
# counts the messages it received, never a counter inside the job.
class ReferenceProvider
  attr_reader :port

  # on_receive: called with each reference once it is recorded, before the caller hears so (the soak answers a
  # few ms late with it, so that kills land inside the effect too).
  def initialize(on_receive: nil)
    @references = []
    @lock = Mutex.new
    @on_receive = on_receive
  end

  def start
    @server = TCPServer.new("127.0.0.1", 0)
    @port = @server.addr[1]
    @thread = Thread.new { loop { serve(@server.accept) } }
    self
  end

  def stop
    @thread&.kill
    @server&.close
  end

  # The environment that points the job's Net::HTTP here.
  def env
    { "PROVIDER_URL" => "http://127.0.0.1:#{port}" }
  end

  # Messages received, duplicates included.
  def count
    @lock.synchronize { @references.size }
  end

  def clear
    @lock.synchronize { @references.clear }
  end

  # The references received so far, duplicates included.
  def references
    @lock.synchronize { @references.dup }
  end

  private

  def serve(client)
    Thread.new do
      respond(client, *read_request(client))
    rescue IOError, SystemCallError, JSON::ParserError
      nil # the caller died mid-request (a killed worker): nothing was received
    ensure
      client.close
    end
  end

  def read_request(client)
    method, path = client.gets.to_s.split
    headers = {}
    while (line = client.gets) && line != "\r\n"
      name, value = line.split(":", 2)
      headers[name.downcase] = value.strip
    end
    [method, path, client.read(headers.fetch("content-length", "0").to_i)]
  end

  def respond(client, method, path, body)
    if method == "POST" && path == "/messages"
      reference = JSON.parse(body).fetch("reference")
      # Recorded before the reply: once the caller has its 201, the provider has the message.
      @lock.synchronize { @references << reference }
      @on_receive&.call(reference)
      reply(client, 201, { "reference" => reference })
    elsif method == "GET" && path.start_with?("/messages/")
      reference = URI.decode_www_form_component(path.delete_prefix("/messages/"))
      found = @lock.synchronize { @references.include?(reference) }
      found ? reply(client, 200, { "reference" => reference }) : reply(client, 404, { "error" => "not found" })
    else
      reply(client, 404, { "error" => "no such endpoint" })
    end
  end

  def reply(client, status, payload)
    body = JSON.generate(payload)
    reason = { 200 => "OK", 201 => "Created", 404 => "Not Found" }.fetch(status)
    client.write("HTTP/1.1 #{status} #{reason}\r\nContent-Type: application/json\r\n" \
                 "Content-Length: #{body.bytesize}\r\nConnection: close\r\n\r\n#{body}")
  end
end
