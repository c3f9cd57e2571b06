//! The master's rustls server config: ring only, client certificates per
//! `tls.client_auth`, CRLs when configured (checked for the whole chain),
//! ALPN h2 + http/1.1.

use std::sync::Arc;

use pluginsync_common::tls::{self as ptls, TlsError};
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

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

/// A server config and the client verifier inside it.
#[derive(Debug)]
pub struct ServerTls {
    /// What new handshakes use.
    pub config: ServerConfig,
    /// The client-certificate verifier `config` uses (`None` with
    /// `client_auth = "none"`), kept to re-check the certificates of open
    /// connections after a reload (docs/protocol.md §5.2).
    pub client_verifier: Option<Arc<dyn ClientCertVerifier>>,
}

/// Builds the server config from `[tls]`.
pub fn server_config(tls: &TlsConfig) -> Result<ServerConfig, ServerTlsError> {
    server_tls(tls).map(|t| t.config)
}

/// Builds the server config from `[tls]`, with its client verifier.
pub fn server_tls(tls: &TlsConfig) -> Result<ServerTls, ServerTlsError> {
    let provider = ptls::provider();
    let certs = ptls::load_certs("server certificate", &tls.cert)?;
    let key = ptls::load_key(&tls.key)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerTlsError::Rustls(e.to_string()))?;
    let mut client_verifier: Option<Arc<dyn ClientCertVerifier>> = None;
    let builder = if tls.client_auth == ClientAuth::None {
        builder.with_no_client_auth()
    } else {
        let roots = Arc::new(ptls::load_roots(&tls.ca)?);
        let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
        if let Some(crl) = &tls.crl {
            // Every certificate of the client's chain below the trust anchor
            // (the leaf and any intermediate CA) is checked against its
            // issuer's CRL (rustls' default depth, `Chain`), as Puppet's
            // `certificate_revocation = chain`: an intermediate CA that the
            // root revoked takes its certificates with it. A CRL bundle that
            // does not cover an issuer in the chain refuses the client (fail
            // closed).
            verifier = verifier.with_crls(ptls::load_crls(crl)?);
        }
        if tls.client_auth == ClientAuth::Optional {
            verifier = verifier.allow_unauthenticated();
        }
        let verifier: Arc<dyn ClientCertVerifier> = verifier
            .build()
            .map_err(|e| ServerTlsError::Rustls(format!("client verifier: {e}")))?;
        client_verifier = Some(verifier.clone());
        builder.with_client_cert_verifier(verifier)
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        ServerTlsError::Rustls(format!(
            "server certificate and key do not fit together: {e}"
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(ServerTls {
        config,
        client_verifier,
    })
}

/// When the first certificate of the PEM file `path` expires (Unix
/// seconds), or `None` if it cannot be read.
pub fn certificate_expiry(path: &std::path::Path) -> Option<i64> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_file(path).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// The earliest `nextUpdate` of the CRLs in the PEM file `path` (Unix
/// seconds), or `None` if it cannot be read or no CRL has one.
pub fn crl_next_update(path: &std::path::Path) -> Option<i64> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateRevocationListDer::pem_file_iter(path)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|der| {
            let (_, crl) = x509_parser::parse_x509_crl(&der).ok()?;
            crl.next_update().map(|t| t.timestamp())
        })
        .min()
}
