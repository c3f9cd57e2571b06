# An older copy of acme_base's fact. Both modules serve facter/acme_role.rb:
# modules are ordered by name, the first wins, so acme_base's copy is served
# and `pluginsync-master check` reports this one as hidden.
Facter.add(:acme_role) { setcode { 'legacy' } }
