# frozen_string_literal: true

require "socket"

# A real SMTP server on a free port that keeps what it receives: the suite counts emails where they arrive,
# never inside the job. It speaks just enough SMTP for Net::SMTP (EHLO, MAIL, RCPT, DATA, RSET, QUIT).
class SmtpSink
  attr_reader :port

  # on_receive: called with each message once it has arrived, before the sender hears so (the soak answers a
  # few ms late with it, so that kills land inside the effect too).
  def initialize(on_receive: nil)
    @messages = []
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

  # The environment that points the job's Net::SMTP here.
  def env
    { "SMTP_HOST" => "127.0.0.1", "SMTP_PORT" => port.to_s }
  end

  def count
    @lock.synchronize { @messages.size }
  end

  def clear
    @lock.synchronize { @messages.clear }
  end

  # The messages received so far, as sent (headers and body).
  def messages
    @lock.synchronize { @messages.dup }
  end

  private

  def serve(client)
    Thread.new do
      converse(client)
    rescue IOError, SystemCallError
      nil # the sender died mid-conversation (a killed worker): nothing was delivered
    ensure
      client.close
    end
  end

  def converse(client)
    client.write("220 replay sink\r\n")
    while (line = client.gets)
      case line[0, 4].upcase
      when "EHLO", "HELO" then client.write("250 replay sink\r\n")
      when "DATA"
        client.write("354 end with <CRLF>.<CRLF>\r\n")
        # Counted before the reply: once the sender has its 250, the message has arrived.
        receive_data(client)
        client.write("250 queued\r\n")
      when "QUIT" then return client.write("221 bye\r\n")
      else client.write("250 ok\r\n")
      end
    end
  end

  def receive_data(client)
    lines = []
    while (line = client.gets) && line != ".\r\n"
      lines << line
    end
    return unless line

    @lock.synchronize { @messages << lines.join }
    @on_receive&.call(lines.join)
  end
end
