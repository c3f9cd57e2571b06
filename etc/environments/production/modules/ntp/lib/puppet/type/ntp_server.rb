Puppet::Type.newtype(:ntp_server) do
  @doc = 'An NTP server this node synchronises with.'
  ensurable
  newparam(:name, namevar: true) do
    desc 'The server host name.'
  end
  newproperty(:iburst) do
    desc 'Whether to send a burst of packets at start.'
    newvalues(:true, :false)
  end
end
