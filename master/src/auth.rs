//! Who may read what: the client's identity and `[[authorization]]` rules.
//!
//! The identity is the subject CN of the client certificate, as in Puppet
//! Server. Without rules every authenticated client may read every
//! environment (Puppet's default `auth.conf` for the file endpoints). With
//! rules, the first rule whose `certname` glob matches decides, and a client
//! matched by no rule is refused, like `auth.conf`'s final deny-all.

use std::sync::Arc;

use axum_server::tls::TlsInfo;
use globset::{Glob, GlobMatcher, GlobSet, GlobSetBuilder};

use crate::config::{AuthRule, ConfigError};

/// The subject CN of the leaf certificate a client presented, if any.
pub fn peer_common_name(info: Option<&Arc<TlsInfo>>) -> Option<String> {
    let der = info?.peer_certificates.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(cn)
}

/// Compiled `[[authorization]]` rules.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    rules: Vec<(GlobMatcher, GlobSet)>,
}

impl Authorizer {
    /// Compiles the rules; a bad glob is a config error naming it.
    pub fn new(rules: &[AuthRule]) -> Result<Self, ConfigError> {
        let glob = |g: &str, what: &str| {
            Glob::new(g).map_err(|e| {
                ConfigError::Invalid(format!("[[authorization]] {what} glob '{g}': {}", e.kind()))
            })
        };
        let mut compiled = Vec::with_capacity(rules.len());
        for rule in rules {
            let cert = glob(&rule.certname, "certname")?.compile_matcher();
            let mut envs = GlobSetBuilder::new();
            for e in &rule.environments {
                envs.add(glob(e, "environments")?);
            }
            let envs = envs.build().map_err(|e| {
                ConfigError::Invalid(format!("[[authorization]] environments: {e}"))
            })?;
            compiled.push((cert, envs));
        }
        Ok(Authorizer { rules: compiled })
    }

    /// True if `certname` may read `environment`.
    pub fn allows(&self, certname: &str, environment: &str) -> bool {
        if self.rules.is_empty() {
            return true;
        }
        self.rules
            .iter()
            .find(|(cert, _)| cert.is_match(certname))
            .is_some_and(|(_, envs)| envs.is_match(environment))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(c: &str, e: &[&str]) -> AuthRule {
        AuthRule {
            certname: c.into(),
            environments: e.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn no_rules_allows_everyone() {
        assert!(Authorizer::new(&[]).unwrap().allows("any", "production"));
    }

    #[test]
    fn first_matching_rule_decides_and_unmatched_is_denied() {
        let a = Authorizer::new(&[
            rule("*.dmz.example.org", &["dmz"]),
            rule("*.example.org", &["production", "feature_*"]),
        ])
        .unwrap();
        assert!(a.allows("web1.dmz.example.org", "dmz"));
        assert!(!a.allows("web1.dmz.example.org", "production"));
        assert!(a.allows("db1.example.org", "feature_x"));
        assert!(!a.allows("db1.example.org", "dmz"));
        assert!(!a.allows("laptop.other.net", "production"));
    }

    #[test]
    fn bad_glob_names_itself() {
        let e = Authorizer::new(&[rule("[", &["x"])])
            .unwrap_err()
            .to_string();
        assert!(e.contains("certname glob '['"), "{e}");
    }
}
