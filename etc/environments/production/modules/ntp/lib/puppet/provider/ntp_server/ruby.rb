Puppet::Type.type(:ntp_server).provide(:ruby) do
  desc 'Manages server lines in /etc/ntp.conf.'
  CONF = '/etc/ntp.conf'.freeze

  def exists?
    File.readlines(CONF).any? { |l| l.split[0..1] == ['server', resource[:name]] }
  end

  def create
    File.open(CONF, 'a') { |f| f.puts("server #{resource[:name]} iburst") }
  end

  def destroy
    lines = File.readlines(CONF).reject { |l| l.split[0..1] == ['server', resource[:name]] }
    File.write(CONF, lines.join)
  end
end
