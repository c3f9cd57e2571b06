//! The internal resource catalog: one recursive, purging file resource per
//! destination, as Puppet's `Downloader` builds (docs/protocol.md §4.1).
//!
//! `pluginfacts` comes first (unless `factsdir = ""` turns it off), then
//! `plugins`, as in Puppet. The resource's switches are honoured by the
//! sync, not just recorded: `purge` decides whether local extras are
//! removed, `force` whether an entry of the wrong type may be replaced.

use std::path::PathBuf;

use pluginsync_common::envname::EnvName;
use pluginsync_common::ignore::IgnoreSet;
use pluginsync_common::metadata::Links;
use pluginsync_common::protocol::Mount;

use crate::config::SourcePermissions;
use crate::settings::Settings;

/// A `file` resource with `ensure => directory, recurse => true`.
#[derive(Debug, Clone)]
pub struct FileResource {
    /// The destination directory (`path`).
    pub path: PathBuf,
    /// The source mount: `puppet:///<mount>`.
    pub mount: Mount,
    /// Remove local entries the source lacks.
    pub purge: bool,
    /// Replace entries of the wrong type (a file where a directory goes).
    pub force: bool,
    /// Keep copies of replaced files (never: there is no filebucket).
    pub backup: bool,
    /// How the source is read: `follow` (links arrive as files).
    pub links: Links,
    /// Basename globs neither synced nor purged, compiled once with the
    /// config (`config.rs`).
    pub ignore: IgnoreSet,
    /// Whether modes come from the source.
    pub source_permissions: SourcePermissions,
}

/// The catalog of one run.
#[derive(Debug, Clone)]
pub struct Catalog {
    /// The environment the resources are fetched from.
    pub environment: EnvName,
    /// The resources, in application order.
    pub resources: Vec<FileResource>,
}

/// Builds the catalog for `settings`.
pub fn build(settings: &Settings) -> Catalog {
    let resource = |path: PathBuf, mount, perms| FileResource {
        path,
        mount,
        purge: true,
        force: true,
        backup: false,
        links: Links::Follow,
        ignore: settings.ignore.clone(),
        source_permissions: perms,
    };
    let mut resources = Vec::new();
    if let Some(f) = &settings.factsdir {
        resources.push(resource(
            f.clone(),
            Mount::Pluginfacts,
            settings.pluginfacts_permissions,
        ));
    }
    resources.push(resource(
        settings.libdir.clone(),
        Mount::Plugins,
        settings.plugins_permissions,
    ));
    Catalog {
        environment: settings.environment.clone(),
        resources,
    }
}
