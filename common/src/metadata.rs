//! The file metadata object of Puppet's v3 file-serving API.
//!
//! One [`FileMetadata`] per entry of a `file_metadatas` answer (a JSON array)
//! or as the whole `file_metadata` answer. Fields are declared in Puppet's key
//! order (docs/protocol.md §2.1) because serde writes them in declaration order and
//! stock agents, while they do not care, are debugged by people reading diffs
//! against Puppet Server output. Parsing is lenient where Puppet is (owner and
//! group may be numbers or SID strings, `links` may be absent, unknown keys
//! such as `content_uri` are ignored) and strict where the agent relies on the
//! value (`type`, `mode`, `checksum`).

use serde::{Deserialize, Serialize};

/// `links` of a request and of each entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Links {
    /// `lstat`: symlinks are reported as `type: "link"` with a `destination`.
    #[default]
    Manage,
    /// `stat`: symlinks are reported as what they point to.
    Follow,
}

impl Links {
    /// Parses a request's `links` value; Puppet maps `ignore` to `manage`.
    pub fn parse(s: &str) -> Option<Links> {
        match s {
            "manage" | "ignore" => Some(Links::Manage),
            "follow" => Some(Links::Follow),
            _ => None,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Links::Manage => "manage",
            Links::Follow => "follow",
        }
    }
}

/// The `type` of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileType {
    /// A regular file (or, under `links=follow`, a link to one).
    File,
    /// A directory.
    Directory,
    /// A symlink, only under `links=manage`.
    Link,
    /// Fifos, sockets and anything else a peer may send; never synced.
    #[serde(other)]
    Other,
}

/// `owner` / `group`: a numeric id on POSIX servers, a SID string on Windows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Principal {
    /// A POSIX uid or gid.
    Id(u64),
    /// A Windows SID or a name.
    Name(String),
}

/// `checksum`: `{"type": "sha256", "value": "{sha256}<hex>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checksum {
    /// The checksum type name (`sha256`, `ctime`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// The value with its `{type}` prefix.
    pub value: String,
}

/// One metadata entry, keys in Puppet's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMetadata {
    /// Absolute base directory of a search entry, or the full path of a find.
    pub path: String,
    /// Path below `path`; `"."` for the search root, `null` for a find.
    pub relative_path: Option<String>,
    /// Echo of the request's `links`.
    #[serde(default)]
    pub links: Links,
    /// uid (the server's euid under `source_permissions=ignore`).
    pub owner: Principal,
    /// gid (the server's egid under `source_permissions=ignore`).
    pub group: Principal,
    /// `st_mode & 07777` under `source_permissions=use`, else 420 (0644).
    pub mode: u32,
    /// The checksum; `null` when Puppet could not compute it (a dangling link).
    pub checksum: Option<Checksum>,
    /// `file`, `directory` or `link`.
    #[serde(rename = "type")]
    pub kind: FileType,
    /// The link target, verbatim, for `type: "link"`; otherwise `null`.
    #[serde(default)]
    pub destination: Option<String>,
}

/// The error body of every Puppet API error: `{"message", "issue_kind"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiErrorBody {
    /// `"<Prefix>: <text>"`, e.g. `Not Found: Could not find environment 'x'`.
    pub message: String,
    /// Puppet's issue kind, e.g. `RUNTIME_ERROR`, `RESOURCE_NOT_FOUND`.
    pub issue_kind: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAB: &str = r#"{"path":"/etc/puppetlabs/code/environments/production/modules/beta/lib","relative_path":"facter/linked.rb","links":"follow","owner":0,"group":0,"mode":420,"checksum":{"type":"sha256","value":"{sha256}d8f984726f50f99de552acb7c5e6b0e61430a911775fed74f68a30b0c214db42"},"type":"file","destination":null}"#;

    #[test]
    fn round_trips_puppet_json_byte_for_byte() {
        let m: FileMetadata = serde_json::from_str(LAB).unwrap();
        assert_eq!(m.kind, FileType::File);
        assert_eq!(m.relative_path.as_deref(), Some("facter/linked.rb"));
        assert_eq!(serde_json::to_string(&m).unwrap(), LAB);
    }

    #[test]
    fn lenient_where_puppet_is() {
        let win = r#"{"path":"C:/x","relative_path":".","owner":"S-1-5-32-544","group":"S-1-0-0","mode":420,"checksum":null,"type":"fifo","content_uri":"puppet:///x"}"#;
        let m: FileMetadata = serde_json::from_str(win).unwrap();
        assert_eq!(m.links, Links::Manage);
        assert_eq!(m.kind, FileType::Other);
        assert_eq!(m.owner, Principal::Name("S-1-5-32-544".into()));
        assert_eq!(m.destination, None);
    }

    #[test]
    fn strict_where_the_agent_relies() {
        let no_type =
            r#"{"path":"/x","relative_path":".","owner":0,"group":0,"mode":420,"checksum":null}"#;
        assert!(serde_json::from_str::<FileMetadata>(no_type).is_err());
        let bad_mode = r#"{"path":"/x","relative_path":".","owner":0,"group":0,"mode":"0644","checksum":null,"type":"file"}"#;
        assert!(serde_json::from_str::<FileMetadata>(bad_mode).is_err());
    }
}
