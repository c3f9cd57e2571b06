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
        Pki::make(
            AGENTS.iter().map(|s| s.to_string()).collect(),
            vec!["revoked".into()],
        )
    }

    /// Server `localhost` and the agents `names`, none revoked: a fleet
    /// of nodes with certnames of their own.
    pub fn with_agents(names: &[String]) -> Pki {
        Pki::make(names.to_vec(), Vec::new())
    }

    fn make(agents: Vec<String>, revoke: Vec<String>) -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let ssldir = dir.path().join("ssl");
        devcerts::generate(&DevCertsOptions {
            out: ssldir.clone(),
            server_names: vec!["localhost".into()],
            agents,
            revoke,
            days: 400,
        })
        .expect("dev certs");
        Pki { _dir: dir, ssldir }
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
