# True when ntpq reports a system peer.
Facter.add(:ntp_synced) do
  setcode do
    out = Facter::Core::Execution.execute('ntpq -pn', on_fail: nil)
    !out.nil? && out.lines.any? { |l| l.start_with?('*') }
  end
end
