# Reports the role of this node, read from /etc/acme/role.
Facter.add(:acme_role) do
  confine kernel: 'Linux'
  setcode do
    path = '/etc/acme/role'
    File.exist?(path) ? File.read(path).strip : 'unassigned'
  end
end
