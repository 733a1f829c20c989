# frozen_string_literal: true

require "socket"
require "uri"

# A TCP proxy in front of PostgreSQL, for the fault specs: a worker whose DATABASE_URL points here loses its
# database for real when the proxy stops. `stop` closes the listening socket (new connections are refused) and
# cuts every open connection, both ways; `start` listens again on the same port. Nothing is mocked: the worker's
# driver meets a refused port and dead sockets, and PostgreSQL sees its clients go and rolls back what they had
# open.
class DbProxy
  attr_reader :port

  def initialize(database_url)
    upstream = URI(database_url)
    raise ArgumentError, "DbProxy: DATABASE_URL names no host: give PostgreSQL's host and port" unless upstream.host

    @database_url = database_url
    @upstream = [upstream.host, upstream.port || 5432]
    @lock = Mutex.new
    @open = []
    @accepted = 0
  end

  # The database URL of the worker, through the proxy.
  def url
    URI(@database_url).tap do |uri|
      uri.host = "127.0.0.1"
      uri.port = port
    end.to_s
  end

  def start
    @server = listen
    @port = @server.addr[1]
    @acceptor = Thread.new(@server) { |server| accept_from(server) }
    self
  end

  # Refuses new connections and cuts the open ones; returns how many it cut.
  def stop
    server = @server
    @server = nil
    server&.close
    @acceptor&.join
    cut = @lock.synchronize { @open.dup.tap { @open.clear } }
    cut.each { |sockets| sockets.each { |socket| close(socket) } }
    cut.size
  end

  def running?
    !@server.nil?
  end

  # Connections made through the proxy since it was created.
  def accepted
    @lock.synchronize { @accepted }
  end

  private

  # The first start takes a port below the range the kernel hands out to outgoing connections, so that no
  # client socket can hold it while the proxy is stopped; later starts take the same port again.
  def listen
    return TCPServer.new("127.0.0.1", @port) if @port

    first, = File.read("/proc/sys/net/ipv4/ip_local_port_range").split.map(&:to_i)
    20.times do
      return TCPServer.new("127.0.0.1", rand(10_000...[first, 20_000].max))
    rescue Errno::EADDRINUSE
      next
    end
    TCPServer.new("127.0.0.1", 0)
  end

  def accept_from(server)
    loop { relay(server.accept) }
  rescue IOError, SystemCallError
    nil # stopped: the listening socket was closed
  end

  def relay(client)
    upstream = TCPSocket.new(*@upstream)
    [client, upstream].each { |socket| socket.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1) }
    pair = [client, upstream]
    @lock.synchronize do
      @open << pair
      @accepted += 1
    end
    Thread.new { pump(client, upstream, pair) }
    Thread.new { pump(upstream, client, pair) }
  rescue SystemCallError
    close(client) # PostgreSQL itself refused: so does the proxy
  end

  # Copies one direction until either side closes, then closes both.
  def pump(from, to, pair)
    loop { to.write(from.readpartial(65_536)) }
  rescue IOError, SystemCallError
    @lock.synchronize { @open.delete(pair) }
    pair.each { |socket| close(socket) }
  end

  def close(socket)
    socket.close
  rescue IOError
    nil # closed already
  end
end
