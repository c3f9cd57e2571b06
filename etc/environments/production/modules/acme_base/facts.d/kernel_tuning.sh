#!/bin/sh
# External fact: reports whether the acme sysctl profile is applied.
if [ -r /etc/sysctl.d/60-acme.conf ]; then
  echo "acme_sysctl_profile=applied"
else
  echo "acme_sysctl_profile=missing"
fi
