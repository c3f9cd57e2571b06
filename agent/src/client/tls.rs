//! The one TLS configuration of the agent's requests: only the configured
//! CA is trusted (no system roots), the node presents its certificate
//! (checked for its dates first: `certs.rs`), an optional CRL, HTTPS only,
//! HTTP/2 where the master offers it, no redirects and no proxy.

use std::time::Duration;

use pluginsync_common::tls::{install_default_provider, read_identity_pem, read_pem};

use super::error::SetupError;
use crate::config::TlsFiles;

/// Flattens an error and its sources into one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let next = c.to_string();
        if !s.contains(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = c.source();
    }
    s
}

/// The HTTP client for `tls`.
pub fn http_client(tls: &TlsFiles) -> Result<reqwest::Client, SetupError> {
    install_default_provider();
    // This node's certificate, before any connection: a master would
    // only answer "connection closed" (docs/tls.md#certificate-checks).
    match crate::certs::check_own(
        &tls.cert,
        std::time::SystemTime::now(),
        tls.cert_expiry_warning,
    ) {
        Ok(None) => {}
        Ok(Some(warning)) => tracing::warn!("{warning}"),
        Err(e) => return Err(SetupError::Certificate(e)),
    }
    let ca =
        reqwest::Certificate::from_pem_bundle(&read_pem("CA bundle", &tls.ca)?).map_err(|e| {
            SetupError::Unusable {
                what: "CA bundle",
                path: tls.ca.clone(),
                detail: chain(&e),
            }
        })?;
    let identity =
        reqwest::Identity::from_pem(&read_identity_pem(&tls.cert, &tls.key)?).map_err(|e| {
            SetupError::Identity {
                cert: tls.cert.clone(),
                key: tls.key.clone(),
                detail: chain(&e),
            }
        })?;
    let mut b = reqwest::Client::builder()
        .tls_certs_only(ca)
        .identity(identity)
        .https_only(true)
        .user_agent(concat!("pluginsync-agent/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
        // HTTP/2 where the master offers it (ALPN): a run's parallel
        // downloads are streams of one connection, one handshake. An
        // HTTP/1.1-only agent was measured and not kept: no difference in
        // the master's CPU per no-op run beyond the bench's noise (A/B, 60
        // runs each: 1.07/1.42 ms HTTP/2 against 1.15/1.32 ms), and more
        // connections, so more full handshakes, on runs that download. Up
        // to 16 idle connections per server (HTTP/1.1 masters: one per
        // download in flight).
        .pool_max_idle_per_host(crate::config::DEFAULT_PARALLEL_DOWNLOADS)
        // A 3xx is an answer, never a hop: the node's certificate and its
        // requests go to the configured server only (docs/protocol.md
        // §4.4).
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    if let Some(crl) = &tls.crl {
        let crls = reqwest::tls::CertificateRevocationList::from_pem_bundle(&read_pem("CRL", crl)?)
            .map_err(|e| SetupError::Unusable {
                what: "CRL",
                path: crl.clone(),
                detail: chain(&e),
            })?;
        b = b.tls_crls_only(crls);
    }
    b.build().map_err(|e| SetupError::Build(chain(&e)))
}
