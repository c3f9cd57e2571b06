//! Turning a request into checked inputs: query parameters (form-decoded,
//! repeated keys kept), the path after the endpoint (percent-decoded once,
//! `.`/`..` segments, NUL and backslashes refused), content negotiation and
//! conditional-request headers.

use axum::http::HeaderMap;
use axum::http::header;
use pluginsync_common::checksum::ChecksumType;
use pluginsync_common::etag::ETag;
use pluginsync_common::metadata::Links;
use pluginsync_common::relpath::RelPath;
use pluginsync_common::urlpath;

use crate::api_error::ApiError;
use crate::index::{Mount, SearchParams};

/// The query string, decoded into pairs in order.
#[derive(Debug, Default)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Form-decodes a raw query string (`+` is a space here, as in Puppet).
    pub fn parse(raw: Option<&str>) -> Self {
        Query(
            form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The last value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order.
    pub fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// `<mount>[/<path>]` after the endpoint, decoded and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPath {
    /// The mount.
    pub mount: Mount,
    /// The path below the mount; the root when empty.
    pub path: RelPath,
}

/// Outcome of parsing the raw path after `/puppet/v3/<endpoint>/`.
#[derive(Debug, PartialEq, Eq)]
pub enum PathError {
    /// 400: a `.`/`..` segment, NUL, backslash, or bad UTF-8.
    Invalid(String),
    /// 404: not a mount this master serves.
    UnknownMount(String),
}

/// Decodes and checks the raw (still percent-encoded) path after the
/// endpoint. Repeated slashes are compacted, as Puppet Server does.
pub fn mount_path(raw: &str) -> Result<MountPath, PathError> {
    let decoded = urlpath::decode_path(raw).map_err(|e| PathError::Invalid(e.to_string()))?;
    if decoded.contains('\0') {
        return Err(PathError::Invalid("NUL byte in path".into()));
    }
    if decoded.contains('\\') {
        return Err(PathError::Invalid("backslash in path".into()));
    }
    let segments: Vec<&str> = decoded.split('/').filter(|s| !s.is_empty()).collect();
    if segments.iter().any(|s| *s == "." || *s == "..") {
        return Err(PathError::Invalid(format!(
            "Invalid relative path (.. or .) in: {decoded}"
        )));
    }
    let Some((mount, rest)) = segments.split_first() else {
        return Err(PathError::UnknownMount(String::new()));
    };
    let mount: Mount = mount
        .parse()
        .map_err(|_| PathError::UnknownMount((*mount).to_owned()))?;
    let path = if rest.is_empty() {
        RelPath::root()
    } else {
        RelPath::parse(&rest.join("/")).map_err(|e| PathError::Invalid(e.to_string()))?
    };
    Ok(MountPath { mount, path })
}

/// `links`, default `manage`.
pub fn links(q: &Query) -> Result<Links, ApiError> {
    match q.get("links") {
        None => Ok(Links::Manage),
        Some(v) => Links::parse(v).ok_or_else(|| {
            ApiError::bad_request(format!("links must be manage or follow, not '{v}'"))
        }),
    }
}

/// `checksum_type`, default `sha256`.
pub fn checksum_type(q: &Query) -> Result<ChecksumType, ApiError> {
    match q.get("checksum_type") {
        None => Ok(ChecksumType::Sha256),
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_request(format!("Unsupported checksum type {v}"))),
    }
}

/// `source_permissions`: `use`/`use_when_creating` report real owner, group
/// and mode; `ignore` (the default) reports the master's ids and 0644.
pub fn use_permissions(q: &Query) -> Result<bool, ApiError> {
    match q.get("source_permissions") {
        None | Some("ignore") => Ok(false),
        Some("use") | Some("use_when_creating") => Ok(true),
        Some(v) => Err(ApiError::bad_request(format!(
            "source_permissions must be use, use_when_creating or ignore, not '{v}'"
        ))),
    }
}

/// The parameters of a search, plus `max_files` (`None` for no limit).
pub fn search_params(q: &Query) -> Result<(SearchParams, Option<usize>), ApiError> {
    let (recurse, mut recurselimit) = match q.get("recurse") {
        None => (false, None),
        Some("true") | Some("remote") | Some("inf") => (true, None),
        Some("false") => (false, None),
        Some(n) => match n.parse::<u32>() {
            Ok(n) => (true, Some(n)),
            Err(_) => {
                return Err(ApiError::bad_request(format!(
                    "recurse must be true, false or a depth, not '{n}'"
                )));
            }
        },
    };
    match q.get("recurselimit") {
        None | Some("inf") => {}
        Some(n) => {
            recurselimit = Some(n.parse::<u32>().map_err(|_| {
                ApiError::bad_request(format!("recurselimit must be a number, not '{n}'"))
            })?)
        }
    }
    let max_files = match q.get("max_files") {
        None | Some("-1") | Some("0") => None,
        Some(n) => Some(n.parse::<usize>().map_err(|_| {
            ApiError::bad_request(format!("max_files must be a number, not '{n}'"))
        })?),
    };
    Ok((
        SearchParams {
            recurse,
            recurselimit,
            links: links(q)?,
            ignore: q.all("ignore"),
            checksum_type: checksum_type(q)?,
            use_permissions: use_permissions(q)?,
        },
        max_files,
    ))
}

/// Media types in `Accept`, parameters stripped; empty when absent.
fn accepted(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| {
            t.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .filter(|t| !t.is_empty())
        .collect()
}

/// Checks `Accept` against the types an endpoint produces; no header
/// accepts anything.
pub fn check_accept(headers: &HeaderMap, produces: &[&str]) -> Result<(), ApiError> {
    let types = accepted(headers);
    if types.is_empty() {
        return Ok(());
    }
    let ok = types.iter().any(|t| {
        t == "*/*"
            || produces
                .iter()
                .any(|p| p == t || (t.ends_with("/*") && p.starts_with(&t[..t.len() - 1])))
    });
    if ok {
        Ok(())
    } else {
        let raw = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        Err(ApiError::not_acceptable(raw))
    }
}

/// True if the client takes gzip (`Accept-Encoding: gzip`, q > 0).
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or_default();
            let zero = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !zero
        })
}

/// The values of the request's `If-None-Match` headers that are text.
pub fn if_none_match(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
}

/// True if `If-None-Match` names `etag` (weak comparison, any encoding
/// suffix ignored, `*` matches: [`ETag::matched_by`]).
pub fn not_modified(headers: &HeaderMap, etag: &ETag) -> bool {
    etag.matched_by(if_none_match(headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn paths() {
        let ok = |raw: &str| mount_path(raw).unwrap();
        assert_eq!(ok("plugins").path, RelPath::root());
        assert_eq!(ok("plugins/").path, RelPath::root());
        assert_eq!(ok("pluginfacts/a%20b.sh").path.as_str(), "a b.sh");
        assert_eq!(ok("plugins//facter//x+y.rb").path.as_str(), "facter/x+y.rb");
        for bad in [
            "plugins/../x",
            "plugins/%2e%2e/x",
            "plugins/a%2F..%2Fb",
            "plugins/./x",
            "plugins/a%00b",
            "plugins/a%5Cb",
            "plugins/%FF",
        ] {
            assert!(
                matches!(mount_path(bad), Err(PathError::Invalid(_))),
                "{bad}"
            );
        }
        assert_eq!(
            mount_path("modules/x"),
            Err(PathError::UnknownMount("modules".into()))
        );
    }

    #[test]
    fn search_parameters() {
        let q = Query::parse(Some(
            "recurse=true&max_files=-1&ignore=.svn&ignore=CVS&ignore=*.a%20b&links=follow&checksum_type=sha256&source_permissions=use&environment=production",
        ));
        let (p, max) = search_params(&q).unwrap();
        assert!(p.recurse && p.use_permissions && max.is_none());
        assert_eq!(p.ignore, vec![".svn", "CVS", "*.a b"]);
        assert_eq!(p.links, Links::Follow);
        let (p, _) = search_params(&Query::parse(Some("recurse=2"))).unwrap();
        assert_eq!(
            (p.recurse, p.recurselimit, p.links),
            (true, Some(2), Links::Manage)
        );
        assert!(search_params(&Query::parse(Some("checksum_type=bogus"))).is_err());
        assert!(search_params(&Query::parse(Some("links=sideways"))).is_err());
        assert!(search_params(&Query::parse(Some("recurse=yes"))).is_err());
    }

    #[test]
    fn negotiation() {
        let mut h = HeaderMap::new();
        assert!(check_accept(&h, &["application/json"]).is_ok());
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/pson"),
        );
        assert!(check_accept(&h, &["application/json", "text/pson"]).is_ok());
        assert!(check_accept(&h, &["application/octet-stream"]).is_err());
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/*;q=0.5"),
        );
        assert!(check_accept(&h, &["application/octet-stream"]).is_ok());
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip;q=1.0,deflate;q=0.6,identity;q=0.3"),
        );
        assert!(accepts_gzip(&h));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip;q=0, identity"),
        );
        assert!(!accepts_gzip(&h));
        h.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static("W/\"abc-gzip\", \"zzz\""),
        );
        assert!(not_modified(&h, &ETag::new("\"abc\"")));
        assert!(!not_modified(&h, &ETag::new("\"abd\"")));
    }
}
