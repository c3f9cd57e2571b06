//! Certificates: [`Pki`], a throwaway CA and certificates in a Puppet-style
//! ssldir, made by the master's own `dev-certs` code, with the agents
//! [`AGENTS`] (`revoked` is in the CRL).

use std::path::PathBuf;

use pluginsync_master::devcerts::{self, DevCertsOptions};

/// The agent certnames every [`Pki`] has.
pub const AGENTS: [&str; 3] = ["node1", "node2", "revoked"];

/// A development CA and certificates in a Puppet-style ssldir.
pub struct Pki {
    _dir: tempfile::TempDir,
    /// The ssldir.
    pub ssldir: PathBuf,
}

impl Pki {
    /// Server `localhost`, agents [`AGENTS`], `revoked` in the CRL.
    pub fn new() -> Pki {
        Pki::with_agents(&[])
    }

    /// [`Pki::new`] with the agents `more` too (a fleet of certnames).
    pub fn with_agents(more: &[String]) -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let ssldir = dir.path().join("ssl");
        devcerts::generate(&DevCertsOptions {
            out: ssldir.clone(),
            server_names: vec!["localhost".into()],
            agents: AGENTS
                .iter()
                .map(|s| s.to_string())
                .chain(more.iter().cloned())
                .collect(),
            revoke: vec!["revoked".into()],
            days: 400,
        })
        .expect("dev certs");
        Pki { _dir: dir, ssldir }
    }

    /// Adds a server certificate `name` (SANs `name`, `localhost`,
    /// `127.0.0.1`, `::1`) from the same CA: a second replica's identity.
    pub fn add_server(&self, name: &str) {
        devcerts::generate(&DevCertsOptions {
            out: self.ssldir.clone(),
            server_names: vec![name.into()],
            agents: Vec::new(),
            revoke: vec!["revoked".into()],
            days: 400,
        })
        .expect("dev certs");
    }

    /// `certs/<name>.pem`.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.ssldir.join(format!("certs/{name}.pem"))
    }

    /// `private_keys/<name>.pem`.
    pub fn key(&self, name: &str) -> PathBuf {
        self.ssldir.join(format!("private_keys/{name}.pem"))
    }

    /// `certs/ca.pem`.
    pub fn ca(&self) -> PathBuf {
        self.ssldir.join("certs/ca.pem")
    }

    /// `crl.pem`.
    pub fn crl(&self) -> PathBuf {
        self.ssldir.join("crl.pem")
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
