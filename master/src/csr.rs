//! `pluginsync-master csr`: a new ECDSA P-256 key for the master and a
//! certificate signing request for it, in Puppet's ssldir layout, for the
//! fleet's Puppet CA to sign (docs/tls.md#a-p-256-key-for-the-master).
//!
//! Why a key of its own: with a Puppet CA's default RSA 4,096-bit keys the
//! master's signature in every full TLS handshake (CertificateVerify) is
//! most of its CPU per agent run; a P-256 signature costs a small fraction
//! of it, and the agents, whose certificates stay RSA, trust the master's
//! certificate as long as their CA issued it (docs/tls.md#a-p-256-key-for-the-master has the
//! figures). Nothing else changes for the fleet.
//!
//! ```text
//! DIR/private_keys/<certname>.pem         the key (0600), never overwritten
//! DIR/certificate_requests/<certname>.pem the CSR: CN=<certname>, SANs
//! ```
//!
//! Each file is written under a temporary name, created exclusively with a
//! random name and mode 0600, and renamed into place, so a failure leaves
//! no half-written file under its final name and nothing placed in the
//! directory in advance can capture the key; an existing key is never
//! replaced (the master may be serving with it).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{CertificateParams, DnType, KeyPair, SanType};

/// What to make (also the `csr` command line).
#[derive(Debug, Clone, clap::Args)]
pub struct CsrOptions {
    /// The master's certname: the CSR's CN, and the file names.
    #[arg(long, value_parser = certname)]
    pub certname: String,
    /// The ssldir to write into (Puppet's layout; created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Subject alternative names, comma-separated (DNS names or IP
    /// addresses, e.g. `puppet,puppet.example.com`); the certname is always
    /// one (Puppet Server 7's `puppetserver ca sign` signs them).
    #[arg(long, value_delimiter = ',')]
    pub dns_alt_names: Vec<String>,
}

/// The files written.
#[derive(Debug, Clone)]
pub struct Csr {
    /// `private_keys/<certname>.pem`.
    pub key: PathBuf,
    /// `certificate_requests/<certname>.pem`.
    pub request: PathBuf,
}

/// Why no key and CSR were made. Printed by the binary as one line, each
/// cause after `: `.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// `--certname` is not a Puppet certname.
    #[error(transparent)]
    Certname(#[from] BadCertname),
    /// A key is already there; it is never replaced.
    #[error("'{}' exists: not replacing a key (remove it first to make a new one)", .0.display())]
    KeyExists(PathBuf),
    /// rcgen could not make the key.
    #[error("generating a P-256 key")]
    Key(#[source] rcgen::Error),
    /// An alternative name that is neither an IP address nor a DNS name.
    #[error("alt name '{name}' is not a DNS name")]
    AltName {
        /// The name as given.
        name: String,
        /// What rcgen said.
        source: rcgen::Error,
    },
    /// rcgen could not sign the request.
    #[error("signing the request")]
    Sign(#[source] rcgen::Error),
    /// rcgen could not encode the request as PEM.
    #[error("encoding the request")]
    Encode(#[source] rcgen::Error),
    /// A file's path has no directory to write it in.
    #[error("a file in a directory")]
    NoDirectory,
    /// The directory of a file could not be made.
    #[error("cannot create '{}'", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write '{}': {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Makes the key and the CSR of `opts`.
pub fn generate(opts: &CsrOptions) -> Result<Csr, CsrError> {
    let name = certname(&opts.certname)?;
    let name = name.as_str();
    let key_path = opts.out.join("private_keys").join(format!("{name}.pem"));
    let csr_path = opts
        .out
        .join("certificate_requests")
        .join(format!("{name}.pem"));
    if key_path.exists() {
        return Err(CsrError::KeyExists(key_path));
    }
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(CsrError::Key)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    let mut sans = vec![name.to_owned()];
    sans.extend(
        opts.dns_alt_names
            .iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty() && s != name),
    );
    for san in &sans {
        params.subject_alt_names.push(match san.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                SanType::DnsName(san.clone().try_into().map_err(|source| CsrError::AltName {
                    name: san.clone(),
                    source,
                })?)
            }
        });
    }
    let request = params
        .serialize_request(&key)
        .map_err(CsrError::Sign)?
        .pem()
        .map_err(CsrError::Encode)?;
    write_new(&key_path, &key.serialize_pem(), 0o600, false)?;
    if let Err(e) = write_new(&csr_path, &request, 0o644, true) {
        // The key alone is of no use: take it back, so a retry starts clean.
        let _ = std::fs::remove_file(&key_path);
        return Err(e);
    }
    Ok(Csr {
        key: key_path,
        request: csr_path,
    })
}

/// A `--certname` that Puppet's CA would not take as a file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("certname '{0}' is not a Puppet certname (lowercase letters, digits, '-', '.', '_')")]
pub struct BadCertname(pub String);

/// `name` when it is a Puppet certname (lowercase letters, digits, `-`,
/// `.`, `_`; not starting with a dot): it becomes a file name and the CA's
/// key. A bad one is a usage error on the command line.
pub fn certname(name: &str) -> Result<String, BadCertname> {
    if name.is_empty()
        || name.starts_with('.')
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
    {
        return Err(BadCertname(name.to_owned()));
    }
    Ok(name.to_owned())
}

/// Writes `contents` to `path` with `mode`: a temporary file beside it,
/// created exclusively under a random name with mode 0600 (a file or
/// symlink placed there in advance is never opened, so it cannot capture
/// the key, docs/tls.md#a-p-256-key-for-the-master), synced, then renamed
/// into place. With `replace` false an existing `path` is left alone and
/// is an error, even one that appeared since the caller looked.
fn write_new(path: &Path, contents: &str, mode: u32, replace: bool) -> Result<(), CsrError> {
    let parent = path.parent().ok_or(CsrError::NoDirectory)?;
    std::fs::create_dir_all(parent).map_err(|source| CsrError::CreateDir {
        path: parent.to_owned(),
        source,
    })?;
    let error = |source| CsrError::Write {
        path: path.to_owned(),
        source,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".csr-")
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(parent)
        .map_err(error)?;
    tmp.write_all(contents.as_bytes()).map_err(error)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(error)?;
    tmp.as_file().sync_all().map_err(error)?;
    // Dropping a temporary file that was not persisted removes it.
    if replace {
        tmp.persist(path).map_err(|e| error(e.error))?;
    } else {
        tmp.persist_noclobber(path)
            .map_err(|e| match e.error.kind() {
                std::io::ErrorKind::AlreadyExists => CsrError::KeyExists(path.to_owned()),
                _ => error(e.error),
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(dir: &Path, name: &str) -> CsrOptions {
        CsrOptions {
            certname: name.to_owned(),
            out: dir.to_owned(),
            dns_alt_names: vec!["puppet".into(), "127.0.0.1".into()],
        }
    }

    #[test]
    fn writes_a_p256_key_and_a_request_for_the_certname_and_never_replaces_a_key() {
        let t = tempfile::tempdir().unwrap();
        let out = generate(&opts(t.path(), "pluginsync.example.com")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&out.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let pem = std::fs::read_to_string(&out.request).unwrap();
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
            .map(|d: rustls_pki_types::CertificateSigningRequestDer<'_>| d.as_ref().to_vec())
            .unwrap();
        let (_, req) =
            <x509_parser::certification_request::X509CertificationRequest as x509_parser::prelude::FromDer<_>>::from_der(&der).unwrap();
        req.verify_signature().unwrap();
        let info = &req.certification_request_info;
        assert_eq!(info.subject.to_string(), "CN=pluginsync.example.com");
        assert_eq!(
            info.subject_pki
                .algorithm
                .parameters
                .as_ref()
                .map(|p| p.as_oid().unwrap().to_id_string()),
            Some("1.2.840.10045.3.1.7".to_owned()),
            "the key is P-256"
        );
        assert!(pluginsync_common::tls::load_key(&out.key).is_ok());

        let key_before = std::fs::read(&out.key).unwrap();
        let again = generate(&opts(t.path(), "pluginsync.example.com")).unwrap_err();
        assert!(again.to_string().contains("not replacing a key"), "{again}");
        assert_eq!(std::fs::read(&out.key).unwrap(), key_before);

        let bad = generate(&opts(t.path(), "../evil")).unwrap_err();
        assert!(bad.to_string().contains("not a Puppet certname"), "{bad}");
        let entries: Vec<_> = std::fs::read_dir(t.path().join("private_keys"))
            .unwrap()
            .collect();
        assert_eq!(entries.len(), 1, "nothing but the one key");
    }

    /// A file or a symlink placed where the old code wrote its temporary
    /// file never sees the key, and the key is 0600 whatever was there.
    #[test]
    fn a_file_or_symlink_placed_in_advance_cannot_capture_the_key() {
        let t = tempfile::tempdir().unwrap();
        let name = "pluginsync.example.com";
        let keys = t.path().join("private_keys");
        std::fs::create_dir_all(&keys).unwrap();
        let trap = t.path().join("trap");
        std::fs::write(&trap, "").unwrap();
        std::fs::set_permissions(&trap, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&trap, keys.join(format!("{name}.pem.tmp"))).unwrap();
        let reqs = t.path().join("certificate_requests");
        std::fs::create_dir_all(&reqs).unwrap();
        std::fs::write(reqs.join(format!("{name}.pem.tmp")), "").unwrap();
        let out = generate(&opts(t.path(), name)).unwrap();
        assert_eq!(std::fs::read(&trap).unwrap(), b"", "the trap got nothing");
        let meta = std::fs::symlink_metadata(&out.key).unwrap();
        assert!(meta.file_type().is_file(), "the key is a file of its own");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(pluginsync_common::tls::load_key(&out.key).is_ok());
        let req = std::fs::symlink_metadata(&out.request).unwrap();
        assert_eq!(req.permissions().mode() & 0o777, 0o644);
    }
}
