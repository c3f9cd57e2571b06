//! Identity from a trusted TLS-terminating proxy (docs/protocol.md §5.5):
//! the `[proxy]` listener's headers, read as Puppet Server reads them with
//! `allow-header-cert-info` (`X-Client-Verify`, `X-Client-DN`,
//! `X-Client-Cert`).
//!
//! Pure parsing and checking, no I/O: [`subject_certname`] takes the CN out
//! of a subject DN in OpenSSL's one-line form (`/CN=node1/O=Example`,
//! HAProxy's `ssl_c_s_dn`) or RFC 2253's (`CN=node1,O=Example`, nginx's
//! `$ssl_client_s_dn`); [`cert_der`] decodes a URL-encoded PEM certificate
//! (nginx's `$ssl_client_escaped_cert`); [`identify`] decides the identity
//! of one request from its headers. The certificate, when present, is
//! verified against `[tls] ca` and the CRL by the caller's verifier (the
//! one the mTLS listener builds, `tls.rs`), and then alone decides.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use axum::http::HeaderMap;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::auth::{
    NoIdentity, PeerIdentity, ProxyRefused as Refused, Unidentified, Via, certname_of,
    is_valid_certname,
};
use crate::config::{ConfigError, ProxyConfig};
use crate::sample::Sampler;

/// What the proxy listener's layer needs: who is trusted, the header
/// names, and the verifier of certificate headers (replaced on SIGHUP with
/// the reloaded CA and CRL).
#[derive(Debug)]
pub struct Trust {
    trusted: Vec<ipnet::IpNet>,
    headers: Headers,
    verifier: RwLock<Arc<dyn ClientCertVerifier>>,
    /// Requests refused because they came from outside `trusted`.
    pub untrusted: Sampler,
}

impl Trust {
    /// From a validated `[proxy]` and the strict verifier of `[tls]`.
    pub fn new(
        config: &ProxyConfig,
        verifier: Arc<dyn ClientCertVerifier>,
    ) -> Result<Self, crate::config::ConfigError> {
        Ok(Trust {
            trusted: config.trusted_nets()?,
            headers: Headers {
                verify: config.verify_header.to_ascii_lowercase(),
                dn: config.dn_header.to_ascii_lowercase(),
                cert: config.cert_header.to_ascii_lowercase(),
            },
            verifier: RwLock::new(verifier),
            untrusted: Sampler::default(),
        })
    }

    /// Installs the verifier of reloaded TLS files (SIGHUP).
    pub fn set_verifier(&self, verifier: Arc<dyn ClientCertVerifier>) {
        *self.verifier.write().unwrap_or_else(|e| e.into_inner()) = verifier;
    }

    /// True if `peer` is within `trusted` (an IPv4-mapped IPv6 address is
    /// taken as its IPv4 address).
    pub fn trusts(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        self.trusted.iter().any(|net| net.contains(&peer))
    }

    /// The identity a trusted proxy's headers give ([`identify`]).
    pub fn identity(&self, headers: &HeaderMap, now: UnixTime) -> PeerIdentity {
        let verifier = self
            .verifier
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        PeerIdentity {
            certname: identify(headers, &self.headers, verifier.as_ref(), now)
                .map_err(Unidentified::Proxy),
            via: Via::Proxy,
        }
    }
}

/// The header names of `[proxy]` (lowercase, as `HeaderMap` keys them).
#[derive(Debug, Clone)]
pub struct Headers {
    /// `verify_header`, default `X-Client-Verify`.
    pub verify: String,
    /// `dn_header`, default `X-Client-DN`.
    pub dn: String,
    /// `cert_header`, default `X-Client-Cert`.
    pub cert: String,
}

/// The certname the headers prove, as Puppet Server decides it
/// (docs/protocol.md §5.5): none of the three headers may be repeated;
/// the verify header must say `SUCCESS`; then a
/// certificate header, when present, must verify with `verifier` and its
/// CN is the identity (a DN header beside it is ignored); else the DN
/// header's CN is.
pub fn identify(
    headers: &HeaderMap,
    names: &Headers,
    verifier: &dyn ClientCertVerifier,
    now: UnixTime,
) -> Result<String, Refused> {
    // A proxy that appends its header to one the client sent leaves two:
    // taking either would let the client choose its identity.
    for name in [&names.verify, &names.dn, &names.cert] {
        if headers.get_all(name.as_str()).iter().nth(1).is_some() {
            return Err(Refused::Repeated(name.clone()));
        }
    }
    let text = |name: &str| headers.get(name).map(|v| v.to_str().map_err(|_| ()));
    if text(&names.verify) != Some(Ok("SUCCESS")) {
        return Err(Refused::NotVerified);
    }
    if let Some(cert) = text(&names.cert) {
        let chain = cert
            .ok()
            .and_then(cert_der)
            .ok_or(Refused::BadCertificate)?;
        let (leaf, intermediates) = chain.split_first().ok_or(Refused::BadCertificate)?;
        verifier
            .verify_client_cert(leaf, intermediates, now)
            .map_err(Refused::Unverified)?;
        return certname_of(leaf).map_err(|_: NoIdentity| Refused::NoCertname);
    }
    match text(&names.dn) {
        Some(Ok(dn)) => subject_certname(dn).map_err(Refused::BadDn),
        Some(Err(())) => Err(Refused::BadDn("not ASCII text")),
        None => Err(Refused::NoSubject),
    }
}

/// The certificates of a URL-encoded PEM (leaf first), or `None` if it is
/// not one. `+` stays `+` (base64), unlike form decoding.
pub fn cert_der(encoded: &str) -> Option<Vec<CertificateDer<'static>>> {
    use rustls_pki_types::pem::PemObject;
    let pem = percent_encoding::percent_decode_str(encoded).collect::<Vec<u8>>();
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    (!certs.is_empty()).then_some(certs)
}

/// The CN of a subject DN in OpenSSL's one-line form (`/CN=a/O=b`) or RFC
/// 2253's (`CN=a,O=b`, with `\,`, `\+` and `\HH` escapes): exactly one CN,
/// a valid certname (`auth::is_valid_certname`, so no control character
/// reaches a log line). The error says what is wrong.
pub fn subject_certname(dn: &str) -> Result<String, &'static str> {
    let attributes = match dn.strip_prefix('/') {
        Some(rest) => rest
            .split('/')
            .map(|a| Ok(a.to_owned()))
            .collect::<Result<Vec<_>, &'static str>>()?,
        None => rfc2253_attributes(dn)?,
    };
    let mut cns = Vec::new();
    for attribute in &attributes {
        let (key, value) = attribute.split_once('=').ok_or("not a DN")?;
        if key.trim().eq_ignore_ascii_case("CN") {
            cns.push(value);
        } else if key.trim().is_empty() {
            return Err("not a DN");
        }
    }
    match cns.as_slice() {
        [] => Err("no CN"),
        [cn] if is_valid_certname(cn) => Ok((*cn).to_owned()),
        [_] => Err("CN is not a valid certname"),
        _ => Err("several CNs"),
    }
}

/// Splits an RFC 2253 DN into its `type=value` attributes (on unescaped
/// `,` and `+`), unescaping the values.
fn rfc2253_attributes(dn: &str) -> Result<Vec<String>, &'static str> {
    let mut out = Vec::new();
    let mut current = Vec::<u8>::new();
    let mut bytes = dn.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => {
                let next = bytes.next().ok_or("dangling escape")?;
                if next.is_ascii_hexdigit() {
                    let low = bytes.next().ok_or("bad escape")?;
                    current.push(pluginsync_common::hex::byte(next, low).ok_or("bad escape")?);
                } else {
                    current.push(next);
                }
            }
            b',' | b'+' => out.push(std::mem::take(&mut current)),
            b => current.push(b),
        }
    }
    out.push(current);
    out.into_iter()
        .map(|a| String::from_utf8(a).map_err(|_| "not UTF-8"))
        .collect()
}

impl ProxyConfig {
    /// `trusted`, parsed: a CIDR or a bare address (a /32 or /128).
    pub fn trusted_nets(&self) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        self.trusted
            .iter()
            .map(|t| {
                t.parse::<ipnet::IpNet>()
                    .or_else(|_| t.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| {
                        ConfigError::Invalid(format!(
                            "proxy.trusted: '{t}' is not a CIDR (like \"10.0.0.0/8\" or \"::1/128\")"
                        ))
                    })
            })
            .collect()
    }

    /// Checks what serde cannot (`MasterConfig::validate` calls it).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let nets = self.trusted_nets()?;
        if !self.listen.is_empty() && nets.is_empty() {
            return Err(ConfigError::Invalid(
                "proxy.trusted must name the proxies' addresses when proxy.listen is set".into(),
            ));
        }
        for (key, name) in [
            ("verify_header", &self.verify_header),
            ("dn_header", &self.dn_header),
            ("cert_header", &self.cert_header),
        ] {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(ConfigError::Invalid(format!(
                    "proxy.{key}: '{name}' is not an HTTP header name"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_dn_forms_give_the_cn() {
        for dn in [
            "/CN=node1",
            "/CN=node1/O=Example/OU=ops",
            "/O=Example/CN=node1",
            "CN=node1",
            "CN=node1,O=Example,C=DE",
            "O=Example, CN=node1",
            "cn=node1+UID=7,O=x",
        ] {
            assert_eq!(subject_certname(dn), Ok("node1".into()), "{dn:?}");
        }
        assert_eq!(
            subject_certname("CN=web\\2c1,O=x"),
            Ok("web,1".into()),
            "hex escape"
        );
        assert_eq!(subject_certname("CN=a\\,b"), Ok("a,b".into()));
    }

    #[test]
    fn anything_ambiguous_or_forged_is_refused() {
        for (dn, why) in [
            ("/CN=node1/CN=admin", "several CNs"),
            ("CN=node1,CN=admin", "several CNs"),
            ("CN=node1+CN=admin", "several CNs"),
            ("/O=Example", "no CN"),
            ("O=Example", "no CN"),
            ("", "not a DN"),
            ("node1", "not a DN"),
            ("/CN=node1\nINFO forged", "CN is not a valid certname"),
            ("CN=node1\\0AINFO forged", "CN is not a valid certname"),
            ("CN=", "CN is not a valid certname"),
            ("CN=a\\", "dangling escape"),
            ("CN=a\\4", "bad escape"),
        ] {
            assert_eq!(subject_certname(dn), Err(why), "{dn:?}");
        }
    }

    #[test]
    fn certificate_header_is_url_encoded_pem() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "node1");
        let cert = params.self_signed(&key).unwrap();
        let encoded: String =
            percent_encoding::utf8_percent_encode(&cert.pem(), percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        let chain = cert_der(&encoded).unwrap();
        assert_eq!(chain.len(), 1);
        assert_eq!(chain[0].as_ref(), cert.der().as_ref());
        assert_eq!(certname_of(&chain[0]), Ok("node1".into()));
        assert!(cert_der("not%20a%20certificate").is_none());
        assert!(cert_der("").is_none());
    }
}
