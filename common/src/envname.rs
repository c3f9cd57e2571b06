//! [`EnvName`]: a Puppet environment name, `^\w+$` in ASCII.
//!
//! Puppet accepts an environment iff its name matches `\A\w+\Z` (ASCII
//! letters, digits and underscore: docs/protocol.md §3.4). Validating the name
//! before it is joined to an `environmentpath` entry is what keeps
//! `environment=../../etc` from naming a directory.

use std::fmt;
use std::str::FromStr;

/// A validated environment name. Serialised as the name (the master's
/// JSON access log, its rollout state); read back validated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct EnvName(String);

/// The name is empty or has a character outside `[A-Za-z0-9_]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the environment must be purely alphanumeric, not '{0}'")]
pub struct InvalidEnvName(pub String);

impl EnvName {
    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for EnvName {
    type Err = InvalidEnvName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            Ok(EnvName(s.to_owned()))
        } else {
            Err(InvalidEnvName(s.to_owned()))
        }
    }
}

impl<'de> serde::Deserialize<'de> for EnvName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for EnvName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puppet_rules() {
        for ok in ["production", "dev_1", "A", "_"] {
            assert!(ok.parse::<EnvName>().is_ok(), "{ok}");
        }
        for bad in ["", "bad-name", "../etc", "a b", "prod\n", "é", "a.b"] {
            assert!(bad.parse::<EnvName>().is_err(), "{bad:?}");
        }
    }
}
