//! `pluginsync-master dev-certs`: a throwaway CA, server and agent
//! certificates, laid out as a Puppet ssldir.
//!
//! For demos, tests and a first evaluation, never for production (the CA key
//! sits next to the certificates). The layout is Puppet's (docs/protocol.md §5.3)
//! so the same directory works for `pluginsync-master` (`[tls] cert, key,
//! ca, crl`), for `pluginsync-agent` (`[tls] ssldir, certname`) and for a
//! stock `puppet plugin download --ssldir DIR --certname NAME`:
//!
//! ```text
//! DIR/ca/ca_key.pem            CA private key (0600)
//! DIR/certs/ca.pem             CA certificate
//! DIR/crl.pem                  CRL of the CA (lists --revoke'd certnames)
//! DIR/certs/<name>.pem         server and agent certificates
//! DIR/private_keys/<name>.pem  their keys (0600)
//! ```
//!
//! An existing CA in DIR is reused, so agents can be added later.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

/// What to generate (also the `dev-certs` command line).
#[derive(Debug, Clone, clap::Args)]
pub struct DevCertsOptions {
    /// The ssldir to write (an existing CA there is reused).
    #[arg(long)]
    pub out: PathBuf,
    /// The server's name (repeatable; the first is its certname; all are
    /// SANs, plus `localhost`, `127.0.0.1` and `::1`).
    #[arg(long = "server-name", default_value = "localhost")]
    pub server_names: Vec<String>,
    /// An agent certname (repeatable).
    #[arg(long = "agent")]
    pub agents: Vec<String>,
    /// A certname to list in the CRL (repeatable).
    #[arg(long)]
    pub revoke: Vec<String>,
    /// Validity of the server and agent certificates, in days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
}

/// The files written.
#[derive(Debug, Clone)]
pub struct DevCerts {
    /// `certs/ca.pem`.
    pub ca: PathBuf,
    /// `crl.pem`.
    pub crl: PathBuf,
    /// The server certificate.
    pub server_cert: PathBuf,
    /// The server key.
    pub server_key: PathBuf,
    /// The ssldir.
    pub ssldir: PathBuf,
}

/// Why a development ssldir could not be made. Printed by the binary as
/// one line, each cause after `: `.
#[derive(Debug, thiserror::Error)]
pub enum DevCertsError {
    /// No `--server-name`.
    #[error("at least one --server-name is needed")]
    NoServerName,
    /// A certname that cannot be a file name.
    #[error("certname '{0}' is not usable as a file name")]
    BadName(String),
    /// A server name or certname that is not a DNS name.
    #[error("'{name}' is not a DNS name")]
    NotDns {
        /// The name as given.
        name: String,
        /// What rcgen said.
        source: rcgen::Error,
    },
    /// A directory could not be made.
    #[error("cannot create '{}'", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write '{}'", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The existing CA's key or certificate could not be read.
    #[error("cannot read '{}'", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The existing CA's key file holds no key.
    #[error("'{}' is not a key", path.display())]
    NotAKey {
        /// `ca/ca_key.pem`.
        path: PathBuf,
        /// What rcgen said.
        source: rcgen::Error,
    },
    /// The existing CA's certificate is not a CA certificate.
    #[error("'{}' is not a CA", path.display())]
    NotACa {
        /// `certs/ca.pem`.
        path: PathBuf,
        /// What rcgen said.
        source: rcgen::Error,
    },
    /// A key could not be generated (`None`: the CA's).
    #[error("{}", match .name {
        Some(name) => format!("generating the key of '{name}'"),
        None => "generating the CA key".to_owned(),
    })]
    Key {
        /// Whose key.
        name: Option<String>,
        /// What rcgen said.
        source: rcgen::Error,
    },
    /// A certificate could not be signed (`None`: the CA's own).
    #[error("{}", match .name {
        Some(name) => format!("signing '{name}'"),
        None => "self-signing the CA".to_owned(),
    })]
    Sign {
        /// Whose certificate.
        name: Option<String>,
        /// What rcgen said.
        source: rcgen::Error,
    },
    /// `--revoke` names a certname with no certificate here.
    #[error("cannot revoke '{name}': no '{}'", path.display())]
    NothingToRevoke {
        /// The certname.
        name: String,
        /// `certs/<name>.pem`.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The certificate to revoke is not PEM.
    #[error("'{}': {source}", path.display())]
    NotPem {
        /// `certs/<name>.pem`.
        path: PathBuf,
        /// What x509-parser said.
        source: x509_parser::nom::Err<x509_parser::error::PEMError>,
    },
    /// The certificate to revoke is not X.509.
    #[error("'{}': {source}", path.display())]
    NotX509 {
        /// `certs/<name>.pem`.
        path: PathBuf,
        /// What x509-parser said.
        source: x509_parser::nom::Err<x509_parser::error::X509Error>,
    },
    /// The CRL could not be signed.
    #[error("signing the CRL")]
    SignCrl(#[source] rcgen::Error),
    /// The CRL could not be encoded as PEM.
    #[error("encoding the CRL")]
    EncodeCrl(#[source] rcgen::Error),
}

fn write(path: &Path, contents: &str, private: bool) -> Result<(), DevCertsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| DevCertsError::CreateDir {
            path: parent.to_owned(),
            source,
        })?;
    }
    let cannot_write = |source| DevCertsError::Write {
        path: path.to_owned(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .map_err(cannot_write)?;
    f.write_all(contents.as_bytes()).map_err(cannot_write)
}

fn serial_for(name: &str) -> SerialNumber {
    let nanos = OffsetDateTime::now_utc().unix_timestamp_nanos();
    let mut bytes = pluginsync_common::checksum::sha256_bytes(format!("{name}/{nanos}").as_bytes())
        [..16]
        .to_vec();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

/// The parameters of a CA certificate named `common_name`: the
/// development CA's, and an intermediate CA's a test signs with it.
pub fn ca_params(common_name: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, common_name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.key_identifier_method = KeyIdMethod::Sha256;
    p
}

/// Generates (or extends) a development ssldir.
pub fn generate(opts: &DevCertsOptions) -> Result<DevCerts, DevCertsError> {
    let Some(server_name) = opts.server_names.first() else {
        return Err(DevCertsError::NoServerName);
    };
    for name in opts.server_names.iter().chain(&opts.agents) {
        if name.is_empty() || name.contains(['/', '\\', '\0']) || name.starts_with('.') {
            return Err(DevCertsError::BadName(name.clone()));
        }
    }
    let dir = &opts.out;
    let now = OffsetDateTime::now_utc();
    let ca = Ca::load_or_make(dir, now)?;
    let validity = (
        now - Duration::days(1),
        now + Duration::days(i64::from(opts.days.max(1))),
    );
    ca.issue(server_name, server_sans(&opts.server_names)?, validity)?;
    for agent in &opts.agents {
        let san = SanType::DnsName(dns_name(agent)?);
        ca.issue(agent, vec![san], validity)?;
    }
    let crl = ca.write_crl(&opts.revoke, now, opts.days)?;
    Ok(DevCerts {
        ca: ca.cert,
        crl,
        server_cert: dir.join(format!("certs/{server_name}.pem")),
        server_key: dir.join(format!("private_keys/{server_name}.pem")),
        ssldir: dir.clone(),
    })
}

/// The subject alternative names of the server certificate: each of
/// `names` (an IP address or a DNS name) and `localhost`, once each, then
/// `127.0.0.1` and `::1`.
fn server_sans(names: &[String]) -> Result<Vec<SanType>, DevCertsError> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut sans: Vec<SanType> = Vec::new();
    for n in names.iter().map(String::as_str).chain(["localhost"]) {
        let san = match n.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(dns_name(n)?),
        };
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    sans.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    sans.push(SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    Ok(sans)
}

/// `name` as a DNS name of a subject alternative name.
fn dns_name(name: &str) -> Result<rcgen::string::Ia5String, DevCertsError> {
    name.try_into().map_err(|source| DevCertsError::NotDns {
        name: name.to_owned(),
        source,
    })
}

/// The development CA of an ssldir and what it signs there.
pub struct Ca {
    /// The ssldir.
    dir: PathBuf,
    /// `certs/ca.pem`.
    cert: PathBuf,
    /// The CA's certificate and key.
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// The CA already in `dir` (`certs/ca.pem` and `ca/ca_key.pem`), or a
    /// new one, valid for ten years from `now`, written there.
    fn load_or_make(dir: &Path, now: OffsetDateTime) -> Result<Ca, DevCertsError> {
        let cert = dir.join("certs/ca.pem");
        let key_path = dir.join("ca/ca_key.pem");
        if cert.exists() && key_path.exists() {
            return Ca::open(dir);
        }
        let key =
            KeyPair::generate().map_err(|source| DevCertsError::Key { name: None, source })?;
        let mut params = ca_params("pluginsync development CA");
        params.not_before = now - Duration::days(1);
        params.not_after = now + Duration::days(3650);
        params.serial_number = Some(serial_for("ca"));
        let ca = params
            .self_signed(&key)
            .map_err(|source| DevCertsError::Sign { name: None, source })?;
        write(&key_path, &key.serialize_pem(), true)?;
        write(&cert, &ca.pem(), false)?;
        let issuer = Issuer::new(params, key);
        Ok(Ca {
            dir: dir.to_owned(),
            cert,
            issuer,
        })
    }

    /// The CA already in `dir` (`certs/ca.pem` and `ca/ca_key.pem`).
    pub fn open(dir: &Path) -> Result<Ca, DevCertsError> {
        let cert = dir.join("certs/ca.pem");
        let key_path = dir.join("ca/ca_key.pem");
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| DevCertsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let key =
            KeyPair::from_pem(&read(&key_path)?).map_err(|source| DevCertsError::NotAKey {
                path: key_path.clone(),
                source,
            })?;
        let issuer = Issuer::from_ca_cert_pem(&read(&cert)?, key).map_err(|source| {
            DevCertsError::NotACa {
                path: cert.clone(),
                source,
            }
        })?;
        Ok(Ca {
            dir: dir.to_owned(),
            cert,
            issuer,
        })
    }

    /// The CA's certificate and key, to sign with.
    pub fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }

    /// Issues a server-and-client certificate for `name` with `sans`,
    /// valid from `validity.0` to `validity.1`, and writes it and its key
    /// as `certs/<name>.pem` and `private_keys/<name>.pem`.
    fn issue(
        &self,
        name: &str,
        sans: Vec<SanType>,
        validity: (OffsetDateTime, OffsetDateTime),
    ) -> Result<(), DevCertsError> {
        let key = KeyPair::generate().map_err(|source| DevCertsError::Key {
            name: Some(name.to_owned()),
            source,
        })?;
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, name);
        p.subject_alt_names = sans;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        (p.not_before, p.not_after) = validity;
        p.serial_number = Some(serial_for(name));
        p.use_authority_key_identifier_extension = true;
        p.key_identifier_method = KeyIdMethod::Sha256;
        let cert = p
            .signed_by(&key, &self.issuer)
            .map_err(|source| DevCertsError::Sign {
                name: Some(name.to_owned()),
                source,
            })?;
        write(
            &self.dir.join(format!("certs/{name}.pem")),
            &cert.pem(),
            false,
        )?;
        write(
            &self.dir.join(format!("private_keys/{name}.pem")),
            &key.serialize_pem(),
            true,
        )
    }

    /// Writes `crl.pem`: the certificates of the certnames in `revoke`
    /// (each must have `certs/<name>.pem` here), valid for `days` from
    /// `now`. Returns its path.
    fn write_crl(
        &self,
        revoke: &[String],
        now: OffsetDateTime,
        days: u32,
    ) -> Result<PathBuf, DevCertsError> {
        let serials = revoke
            .iter()
            .map(|name| {
                serial_of(&self.dir.join(format!("certs/{name}.pem"))).map_err(|e| match e {
                    DevCertsError::Read { path, source } => DevCertsError::NothingToRevoke {
                        name: name.clone(),
                        path,
                        source,
                    },
                    e => e,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let crl = crl_pem(&self.issuer, &serials, now, days)?;
        let crl_path = self.dir.join("crl.pem");
        write(&crl_path, &crl, false)?;
        Ok(crl_path)
    }
}

/// The serial number (big-endian bytes) of the certificate in the PEM
/// file `path`.
pub fn serial_of(path: &Path) -> Result<Vec<u8>, DevCertsError> {
    let pem = std::fs::read(path).map_err(|source| DevCertsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(&pem).map_err(|source| DevCertsError::NotPem {
            path: path.to_owned(),
            source,
        })?;
    let cert = pem.parse_x509().map_err(|source| DevCertsError::NotX509 {
        path: path.to_owned(),
        source,
    })?;
    Ok(cert.raw_serial().to_vec())
}

/// A CRL signed by `issuer` listing the certificates of `serials` (revoked
/// a minute before `now`), valid from five minutes before `now` for
/// `days`, as PEM: the development CA's `crl.pem`, and a test's CRL of it
/// or of an intermediate CA.
pub fn crl_pem(
    issuer: &Issuer<'_, KeyPair>,
    serials: &[Vec<u8>],
    now: OffsetDateTime,
    days: u32,
) -> Result<String, DevCertsError> {
    CertificateRevocationListParams {
        this_update: now - Duration::minutes(5),
        next_update: now + Duration::days(i64::from(days.max(1))),
        crl_number: SerialNumber::from(now.unix_timestamp().max(1) as u64),
        issuing_distribution_point: None,
        revoked_certs: serials
            .iter()
            .map(|s| RevokedCertParams {
                serial_number: SerialNumber::from_slice(s),
                revocation_time: now - Duration::minutes(1),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: KeyIdMethod::Sha256,
    }
    .signed_by(issuer)
    .map_err(DevCertsError::SignCrl)?
    .pem()
    .map_err(DevCertsError::EncodeCrl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_puppet_ssldir_and_reuses_the_ca() {
        let t = tempfile::tempdir().unwrap();
        let opts = DevCertsOptions {
            out: t.path().to_owned(),
            server_names: vec!["puppet".into()],
            agents: vec!["node1".into()],
            revoke: vec![],
            days: 30,
        };
        let out = generate(&opts).unwrap();
        for f in [
            "certs/ca.pem",
            "crl.pem",
            "certs/puppet.pem",
            "private_keys/puppet.pem",
            "certs/node1.pem",
            "private_keys/node1.pem",
        ] {
            assert!(t.path().join(f).is_file(), "{f}");
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(t.path().join("private_keys/node1.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let ca_before = std::fs::read(&out.ca).unwrap();
        let again = DevCertsOptions {
            agents: vec!["node2".into()],
            revoke: vec!["node1".into()],
            ..opts
        };
        generate(&again).unwrap();
        assert_eq!(
            std::fs::read(&out.ca).unwrap(),
            ca_before,
            "the CA is reused"
        );
        assert!(pluginsync_common::tls::load_crls(&out.crl).is_ok());
    }
}
