//! The master's rustls server config: ring only, client certificates per
//! `tls.client_auth`, CRLs when configured, ALPN h2 + http/1.1.

use std::sync::Arc;

use pluginsync_common::tls::{self as ptls, TlsError};
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;

use crate::config::{ClientAuth, TlsConfig};

/// The TLS setup failed; the message names the file or the reason.
#[derive(Debug, thiserror::Error)]
pub enum ServerTlsError {
    /// A file could not be loaded.
    #[error(transparent)]
    File(#[from] TlsError),
    /// rustls refused the combination.
    #[error("TLS setup: {0}")]
    Rustls(String),
}

/// Builds the server config from `[tls]`.
pub fn server_config(tls: &TlsConfig) -> Result<ServerConfig, ServerTlsError> {
    let provider = ptls::provider();
    let certs = ptls::load_certs("server certificate", &tls.cert)?;
    let key = ptls::load_key(&tls.key)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerTlsError::Rustls(e.to_string()))?;
    let builder = if tls.client_auth == ClientAuth::None {
        builder.with_no_client_auth()
    } else {
        let roots = Arc::new(ptls::load_roots(&tls.ca)?);
        let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
        if let Some(crl) = &tls.crl {
            // The leaf is checked against its issuer's CRL; a CRL bundle that
            // does not cover the issuer refuses the client (fail closed).
            verifier = verifier
                .with_crls(ptls::load_crls(crl)?)
                .only_check_end_entity_revocation();
        }
        if tls.client_auth == ClientAuth::Optional {
            verifier = verifier.allow_unauthenticated();
        }
        let verifier = verifier
            .build()
            .map_err(|e| ServerTlsError::Rustls(format!("client verifier: {e}")))?;
        builder.with_client_cert_verifier(verifier)
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        ServerTlsError::Rustls(format!(
            "server certificate and key do not fit together: {e}"
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
