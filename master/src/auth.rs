//! Who may read what: the client's identity, `[[authorization]]` rules, and
//! the one authorization step every file and blob endpoint goes through.
//!
//! The identity is the subject CN of the client certificate, as in Puppet
//! Server. The gate reads it from one place only, the [`PeerIdentity`]
//! extension each listener's layer puts on each request: the mTLS
//! listener's from the TLS handshake ([`PeerIdentity::from_tls`], never a
//! header), the `[proxy]` listener's from the headers of a trusted proxy
//! (`proxy.rs`; docs/protocol.md §5.1, §5.2, §5.5). Without rules every
//! authenticated client may read every environment (Puppet's default
//! `auth.conf` for the file endpoints). With rules, the first rule whose
//! `certname` glob matches decides, and a client matched by no rule is
//! refused, like `auth.conf`'s final deny-all (docs/protocol.md §5.4).
//!
//! [`Gate`] is the step itself: [`Gate::admit`] refuses a request without a
//! client certificate (403), [`Client::may_read`] applies the rules to one
//! environment, and [`Gate::authorize`] chains them with the environment
//! name check in Puppet Server's order (docs/protocol.md §1.7 steps 2–4).
//! The file endpoints call [`Gate::authorize`]; blobs and batches call
//! [`Gate::admit`] and search only the environments [`Client::may_read`]
//! allows (docs/protocol.md §7.1, §7.2.1).

use std::sync::Arc;

use axum::http::request::Parts;
use axum_server::tls::TlsInfo;
use globset::{Glob, GlobMatcher, GlobSet, GlobSetBuilder};
use pluginsync_common::config::ConfigError;
use pluginsync_common::envname::{EnvName, InvalidEnvName};
use serde::Deserialize;

use crate::api_error::ApiError;
use crate::sample::Sampler;

/// One `[[authorization]]` rule of `master.toml`: the first rule whose
/// `certname` glob matches the client's certname decides; a client matched
/// by no rule is refused.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthRule {
    /// Glob on the client certificate's subject CN, e.g. `"*.dmz.example.org"`.
    pub certname: String,
    /// Globs on the environment names this client may read.
    pub environments: Vec<String>,
}

/// Where a request's identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The client certificate of the mTLS handshake.
    Tls,
    /// The identity headers of a trusted proxy (`[proxy]`).
    Proxy,
}

impl Via {
    /// `tls` or `proxy`, as log lines name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Tls => "tls",
            Via::Proxy => "proxy",
        }
    }
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identity of a request's client, put in its extensions by the
/// listener's layer (`routes.rs`) and read by [`Gate::admit`] and the
/// access log: the one source of identity (docs/protocol.md §5.2, §5.5).
#[derive(Debug, Clone)]
pub struct PeerIdentity {
    /// The certname, or why there is none (for the refusal log line).
    pub certname: Result<String, Unidentified>,
    /// Which listener established it.
    pub via: Via,
}

impl PeerIdentity {
    /// The identity the TLS handshake gives: the CN of the client's leaf
    /// certificate ([`certname_of`]); headers are never looked at.
    pub fn from_tls(info: Option<&TlsInfo>) -> Self {
        Self::from_leaf(
            info.and_then(|i| i.peer_certificates.first())
                .map(Vec::as_slice),
        )
    }

    /// The identity a TLS handshake gives from the client's DER leaf
    /// certificate, `None` when it presented none.
    pub fn from_leaf(leaf: Option<&[u8]>) -> Self {
        Self::with_public_key(leaf).0
    }

    /// [`PeerIdentity::from_leaf`] and the leaf's `SubjectPublicKeyInfo`
    /// ([`public_key_of`]) from one parse of the certificate: what the
    /// mTLS acceptor needs once per connection (`server/accept.rs`).
    pub fn with_public_key(leaf: Option<&[u8]>) -> (Self, Option<Vec<u8>>) {
        let (certname, public_key) = match leaf {
            None => (Err(Unidentified::NoCertificate), None),
            Some(der) => match x509_parser::parse_x509_certificate(der) {
                Err(_) => (Err(Unidentified::Certificate(NoIdentity::Unparsable)), None),
                Ok((_, cert)) => (
                    certname_in(&cert).map_err(Unidentified::Certificate),
                    Some(cert.public_key().raw.to_vec()),
                ),
            },
        };
        let identity = PeerIdentity {
            certname,
            via: Via::Tls,
        };
        (identity, public_key)
    }

    /// The certname, if there is one.
    pub fn certname(&self) -> Option<&str> {
        self.certname.as_deref().ok()
    }
}

/// Why a request has no identity: the reason its `refused: …` log line
/// gives when the policy needs one ([`Gate::admit`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unidentified {
    /// The TLS handshake brought no client certificate.
    #[error("no client certificate")]
    NoCertificate,
    /// The client certificate gives no identity ([`certname_of`]).
    #[error("{}", match .0 {
        NoIdentity::NoCommonName => "client certificate without a CN",
        NoIdentity::SeveralCommonNames => "client certificate with several CNs",
        _ => "client certificate whose CN is not a valid certname",
    })]
    Certificate(NoIdentity),
    /// A trusted proxy's headers give no identity (`proxy.rs`).
    #[error(transparent)]
    Proxy(ProxyRefused),
}

/// Why a trusted proxy's headers give no identity (`proxy::identify`;
/// each is a 403 on the file endpoints; docs/protocol.md §5.5).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProxyRefused {
    /// The verify header is missing or not `SUCCESS`.
    #[error("proxy verify header is not SUCCESS")]
    NotVerified,
    /// Verified, but neither a DN nor a certificate header.
    #[error("proxy sent neither a DN nor a certificate")]
    NoSubject,
    /// The DN header is not a DN, has no CN or several, or its CN is not a
    /// valid certname.
    #[error("proxy DN header: {0}")]
    BadDn(&'static str),
    /// The certificate header is not a URL-encoded PEM certificate.
    #[error("proxy certificate header is not a URL-encoded PEM certificate")]
    BadCertificate,
    /// The certificate does not verify against `[tls] ca` and the CRL.
    #[error("proxy certificate does not verify: {0}")]
    Unverified(rustls::Error),
    /// The verified certificate gives no identity ([`certname_of`]).
    #[error("proxy certificate has no usable CN")]
    NoCertname,
    /// An identity header sent more than once: which one the proxy set
    /// and which one the client smuggled through cannot be told apart
    /// (docs/protocol.md §5.5).
    #[error("proxy header {0} sent more than once")]
    Repeated(String),
}

/// Why a certificate gives no identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoIdentity {
    /// The certificate could not be parsed.
    Unparsable,
    /// Its subject has no CN.
    NoCommonName,
    /// Its subject has more than one CN.
    SeveralCommonNames,
    /// Its CN is not a string, or not a valid certname.
    InvalidCommonName,
}

impl std::fmt::Display for NoIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NoIdentity::Unparsable => "it does not parse",
            NoIdentity::NoCommonName => "it has no DNS name and no CN",
            NoIdentity::SeveralCommonNames => "it has several CNs",
            NoIdentity::InvalidCommonName => "its CN is not a valid certname",
        })
    }
}

/// Whether two DER certificates carry the same public key (their
/// `SubjectPublicKeyInfo`, byte for byte); false if either cannot be
/// parsed. What tells the master's own certificate from another one with
/// its name (`handlers/admin.rs`).
pub fn same_public_key(a: &[u8], b: &[u8]) -> bool {
    matches!((public_key_of(a), public_key_of(b)), (Some(x), Some(y)) if x == y)
}

/// The `SubjectPublicKeyInfo` of a DER certificate, as DER; `None` if it
/// cannot be parsed. What names one node whatever its certificate's name
/// or serial (`server/conns.rs`'s per-client limit, [`same_public_key`]).
pub fn public_key_of(der: &[u8]) -> Option<Vec<u8>> {
    x509_parser::parse_x509_certificate(der)
        .ok()
        .map(|(_, c)| c.public_key().raw.to_vec())
}

/// The certname of a client's DER leaf certificate, if it has one usable as
/// an identity (docs/protocol.md §5.2): its subject must hold exactly one
/// common name, and that name must be a valid Puppet certname
/// ([`is_valid_certname`]). A certificate with two CNs is ambiguous (which
/// one `[[authorization]]` matched would depend on DER order) and one with
/// control characters in its CN could forge log lines: neither is an
/// identity.
pub fn certname_of(der: &[u8]) -> Result<String, NoIdentity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|_| NoIdentity::Unparsable)?;
    certname_in(&cert)
}

/// [`certname_of`] of a certificate already parsed.
fn certname_in(cert: &x509_parser::certificate::X509Certificate<'_>) -> Result<String, NoIdentity> {
    let mut names = cert.subject().iter_common_name();
    let first = names.next().ok_or(NoIdentity::NoCommonName)?;
    if names.next().is_some() {
        return Err(NoIdentity::SeveralCommonNames);
    }
    let cn = first.as_str().map_err(|_| NoIdentity::InvalidCommonName)?;
    if !is_valid_certname(cn) {
        return Err(NoIdentity::InvalidCommonName);
    }
    Ok(cn.to_owned())
}

/// Puppet's rule for a certname (`Puppet::SSL::Base::VALID_CERTNAME`,
/// `/\A[ -.0-~]+\Z/`, docs/protocol.md §5.2): one or more printable ASCII
/// characters other than `/`. No control character, so a certname can be
/// logged as it is.
pub fn is_valid_certname(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| matches!(b, b' '..=b'.' | b'0'..=b'~'))
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

/// Whether client certificates decide who reads what: `tls.client_auth`
/// as the gate sees it (docs/protocol.md §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `"optional"` or `"required"`: a request without a client certificate
    /// is refused, and `[[authorization]]` applies to the certname.
    Certificates,
    /// `"none"`: every client may read every environment; the rules are
    /// ignored.
    Open,
}

/// The authorization step shared by every file and blob endpoint.
#[derive(Debug, Clone)]
pub struct Gate {
    authorizer: Arc<Authorizer>,
    policy: Policy,
    refusals: Arc<Sampler>,
}

/// A client [`Gate::admit`] let in: what it may read.
#[derive(Debug)]
pub struct Client<'a> {
    gate: &'a Gate,
    /// The certname; `None` only under [`Policy::Open`].
    certname: Option<String>,
}

impl Gate {
    /// A gate applying `authorizer` under `policy`.
    pub fn new(authorizer: Authorizer, policy: Policy) -> Self {
        Gate {
            authorizer: Arc::new(authorizer),
            policy,
            refusals: Arc::default(),
        }
    }

    /// Requests refused so far: no usable identity, or `[[authorization]]`.
    pub fn refusals(&self) -> u64 {
        self.refusals.total()
    }

    /// The first half of the step: a request without a client certificate
    /// (or with one that has no CN) is a 403, unless the policy is
    /// [`Policy::Open`]. The identity comes from the request's
    /// [`PeerIdentity`] only.
    pub fn admit(&self, req: &Parts) -> Result<Client<'_>, ApiError> {
        let identity = req.extensions.get::<PeerIdentity>();
        let certname = match identity.map(|i| &i.certname) {
            Some(Ok(name)) => Some(name.clone()),
            refused => {
                if self.policy == Policy::Certificates {
                    let why = match refused {
                        Some(Err(why)) => why,
                        _ => &Unidentified::NoCertificate,
                    };
                    if let Some(n) = self.refusals.note() {
                        tracing::info!(
                            path = req.uri.path(),
                            via = %identity.map_or("none", |i| i.via.as_str()),
                            refused_since_last_line = n,
                            "refused: {why}"
                        );
                    }
                    return Err(ApiError::forbidden(req.uri.path()));
                }
                None
            }
        };
        Ok(Client {
            gate: self,
            certname,
        })
    }

    /// The whole step for an endpoint that names its environment, in
    /// Puppet Server's order (docs/protocol.md §1.7 steps 2–4): no client
    /// certificate → 403, a bad environment name → 400, refused by
    /// `[[authorization]]` → 403. Whether the environment exists is left to
    /// the caller, after this, so a refused client cannot probe for it.
    pub fn authorize(&self, req: &Parts, environment: &str) -> Result<EnvName, ApiError> {
        let client = self.admit(req)?;
        let env: EnvName = environment
            .parse()
            .map_err(|e: InvalidEnvName| ApiError::bad_request(upper_first(&e.to_string())))?;
        if !client.may_read(env.as_str()) {
            if let Some(n) = self.refusals.note() {
                tracing::info!(
                    certname = client.certname.as_deref().unwrap_or_default(),
                    env = %env,
                    path = req.uri.path(),
                    refused_since_last_line = n,
                    "refused by [[authorization]]"
                );
            }
            return Err(ApiError::forbidden(req.uri.path()));
        }
        Ok(env)
    }
}

impl Client<'_> {
    /// True if this client may read `environment`: always under
    /// [`Policy::Open`], else as `[[authorization]]` says for its certname.
    pub fn may_read(&self, environment: &str) -> bool {
        match self.gate.policy {
            Policy::Open => true,
            Policy::Certificates => self
                .certname
                .as_deref()
                .is_some_and(|cn| self.gate.authorizer.allows(cn, environment)),
        }
    }
}

/// Puppet's messages start with a capital; [`InvalidEnvName`]'s does not.
fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
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
    fn certnames_follow_puppets_rule() {
        for good in [
            "web1.example.org",
            "node_1",
            "a",
            "UPPER-case.Example",
            "*.x",
            "a b",
        ] {
            assert!(is_valid_certname(good), "{good:?}");
        }
        for bad in [
            "",
            "a/b",
            "web1\nINFO forged",
            "tab\there",
            "esc\u{1b}[2J",
            "é.example",
        ] {
            assert!(!is_valid_certname(bad), "{bad:?}");
        }
    }

    const TWO_CNS: &str = "-----BEGIN CERTIFICATE-----\nMIIBxTCCAWugAwIBAgIUct/ytIvujecNiHbKyZBQnayKaKIwCgYIKoZIzj0EAwIw\nNzEaMBgGA1UEAwwRYWRtaW4uZXhhbXBsZS5vcmcxGTAXBgNVBAMMEHdlYjEuZXhh\nbXBsZS5vcmcwIBcNMjYxMTIzMjM0NjE1WhgPMjEyNjEwMzAyMzQ2MTVaMDcxGjAY\nBgNVBAMMEWFkbWluLmV4YW1wbGUub3JnMRkwFwYDVQQDDBB3ZWIxLmV4YW1wbGUu\nb3JnMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYFW9PELBORosmbVxagq7jyoi\nLj5HfJ4LTcE2iFYTAyari9DwH3rZyqLcNE3e8zSXx6N7uDgof3g2phGCzVdCEqNT\nMFEwHQYDVR0OBBYEFJK0hKjPnaAMyfQMt1v6k0khr4yyMB8GA1UdIwQYMBaAFJK0\nhKjPnaAMyfQMt1v6k0khr4yyMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwID\nSAAwRQIhAJ98QLo2gDW4JrrpRnPpdEwU1GBg9Llu1pgWOtHTXELYAiBNe3ra3nd5\nPoQy7yHem8vJs4X9dGdwOW6l4z1+ihZ2zg==\n-----END CERTIFICATE-----";

    fn cert_with_cns(cns: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for cn in cns {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, *cn);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn one_valid_cn_is_an_identity_and_nothing_else_is() {
        assert_eq!(
            certname_of(&cert_with_cns(&["web1.example.org"])),
            Ok("web1.example.org".into())
        );
        assert_eq!(
            certname_of(&cert_with_cns(&[])),
            Err(NoIdentity::NoCommonName)
        );
        // rcgen keeps one value per attribute type, so this one was made
        // with `openssl req -x509 -subj "/CN=admin.example.org/CN=web1.example.org"`.
        use rustls_pki_types::pem::PemObject;
        let two = rustls_pki_types::CertificateDer::from_pem_slice(TWO_CNS.as_bytes()).unwrap();
        assert_eq!(certname_of(&two), Err(NoIdentity::SeveralCommonNames));
        assert_eq!(
            certname_of(&cert_with_cns(&["web1\nINFO refused by [[authorization]]"])),
            Err(NoIdentity::InvalidCommonName)
        );
        assert_eq!(
            certname_of(b"not a certificate"),
            Err(NoIdentity::Unparsable)
        );
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
