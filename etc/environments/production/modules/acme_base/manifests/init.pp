class acme_base {
  notify { "role: ${facts['acme_role']}": }
}
