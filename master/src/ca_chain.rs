//! The CA bundle (`[tls] ca`) as a chain, for revocation
//! (docs/tls.md#revocation-and-intermediate-cas): Puppet's intermediate-CA
//! setups put the intermediate CA in `ca.pem` beside the root. Taken as a
//! trust anchor, it would never be checked against the root's CRL (webpki
//! checks the certificates below the anchor only), so a node under a
//! revoked intermediate would still get in. [`split`] keeps only the CAs
//! that no other CA of the bundle issued as anchors; the others are handed
//! to path building as intermediates by [`WithIntermediates`], so every CA
//! between a node and its root is checked against its issuer's CRL.

use std::sync::Arc;

use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

/// The CAs of a bundle, split by who issued them.
#[derive(Debug, Default)]
pub struct Split {
    /// The roots: self-issued, or issued by no CA of the bundle.
    pub anchors: Vec<CertificateDer<'static>>,
    /// The CAs another CA of the bundle issued (its subject is their
    /// issuer).
    pub intermediates: Vec<CertificateDer<'static>>,
}

/// Splits `certs` (a CA bundle) into anchors and intermediates by subject
/// and issuer names; a certificate that cannot be parsed stays an anchor
/// (rustls decides what it makes of it, as before).
pub fn split(certs: Vec<CertificateDer<'static>>) -> Split {
    let names: Vec<Option<(Vec<u8>, Vec<u8>)>> = certs
        .iter()
        .map(|der| {
            let (_, c) = x509_parser::parse_x509_certificate(der).ok()?;
            Some((c.subject().as_raw().to_vec(), c.issuer().as_raw().to_vec()))
        })
        .collect();
    let mut out = Split::default();
    for (i, cert) in certs.into_iter().enumerate() {
        let issued_here = names[i].as_ref().is_some_and(|(subject, issuer)| {
            subject != issuer
                && names
                    .iter()
                    .enumerate()
                    .any(|(j, n)| j != i && n.as_ref().is_some_and(|(s, _)| s == issuer))
        });
        if issued_here {
            out.intermediates.push(cert);
        } else {
            out.anchors.push(cert);
        }
    }
    out
}

/// The subject of each certificate, as a TLS `certificate_authorities`
/// hint (the intermediates were hints while they were anchors; they stay
/// so).
pub fn subjects(certs: &[CertificateDer<'_>]) -> Vec<DistinguishedName> {
    certs
        .iter()
        .filter_map(|der| {
            let (_, c) = x509_parser::parse_x509_certificate(der).ok()?;
            Some(DistinguishedName::from(c.subject().as_raw().to_vec()))
        })
        .collect()
}

/// A client verifier that adds the bundle's intermediates to those the
/// client presents, so a node that sends its leaf alone still chains to
/// the root through them (and each is checked against the root's CRL).
#[derive(Debug)]
pub struct WithIntermediates {
    /// The verifier built on the anchors.
    pub inner: Arc<dyn ClientCertVerifier>,
    /// The bundle's intermediates.
    pub intermediates: Vec<CertificateDer<'static>>,
}

impl ClientCertVerifier for WithIntermediates {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let mut all = intermediates.to_vec();
        all.extend(self.intermediates.iter().cloned());
        self.inner.verify_client_cert(end_entity, &all, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

    fn ca(name: &str) -> (CertificateParams, KeyPair) {
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        (p, KeyPair::generate().unwrap())
    }

    #[test]
    fn only_the_cas_no_other_ca_of_the_bundle_issued_are_anchors() {
        let (root_p, root_k) = ca("root");
        let root = root_p.self_signed(&root_k).unwrap();
        let issuer = Issuer::new(root_p, root_k);
        let (int_p, int_k) = ca("intermediate");
        let intermediate = int_p.signed_by(&int_k, &issuer).unwrap();
        let (other_p, other_k) = ca("other root");
        let other = other_p.self_signed(&other_k).unwrap();
        // An intermediate whose root is not in the bundle stays an anchor.
        let (lone_root_p, lone_root_k) = ca("absent root");
        let (lone_p, lone_k) = ca("lone intermediate");
        let lone = lone_p
            .signed_by(&lone_k, &Issuer::new(lone_root_p, lone_root_k))
            .unwrap();
        let der = |c: &rcgen::Certificate| c.der().clone();
        let split = split(vec![
            der(&intermediate),
            der(&root),
            der(&other),
            der(&lone),
        ]);
        assert_eq!(split.anchors, vec![der(&root), der(&other), der(&lone)]);
        assert_eq!(split.intermediates, vec![der(&intermediate)]);
        assert_eq!(subjects(&split.intermediates).len(), 1);
    }
}
