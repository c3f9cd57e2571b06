//! Small helpers shared by the e2e modules.

use pluginsync_common::metadata::FileMetadata;

/// Puppet's pluginsync search query (docs/protocol.md §1.2) with the given
/// `source_permissions`, `links` and environment.
pub fn pluginsync_query(perms: &str, links: &str, env: &str) -> String {
    format!(
        "recurse=true&max_files=-1&ignore=.svn&ignore=CVS&ignore=.git&ignore=.hg&links={links}&checksum_type=sha256&source_permissions={perms}&environment={env}"
    )
}

/// GETs a listing; returns status, headers and (for 200) the entries.
pub async fn listing(
    client: &reqwest::Client,
    base: &str,
    mount: &str,
    query: &str,
) -> (u16, reqwest::header::HeaderMap, Vec<FileMetadata>) {
    let resp = client
        .get(format!("{base}/puppet/v3/file_metadatas/{mount}?{query}"))
        .header("Accept", "application/json, text/pson")
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.bytes().await.expect("body");
    let entries = if status == 200 {
        serde_json::from_slice(&body).expect("listing is JSON")
    } else {
        Vec::new()
    };
    (status, headers, entries)
}

/// The entry for `rel`, if listed.
pub fn entry<'a>(entries: &'a [FileMetadata], rel: &str) -> Option<&'a FileMetadata> {
    entries
        .iter()
        .find(|e| e.relative_path.as_deref() == Some(rel))
}

/// The relative paths of a listing, in order.
pub fn paths(entries: &[FileMetadata]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| e.relative_path.clone())
        .collect()
}
