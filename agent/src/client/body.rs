//! Reading answers: a download's body chunk by chunk ([`Body`]), any
//! other body up to a cap ([`read_capped`]), and a listing body parsed
//! within [`MAX_LISTING_ENTRIES`] ([`parse_listing`]). The caps are the
//! agent's bounds on what a master can make it hold (docs/protocol.md
//! §4.3).

use bytes::Bytes;
use pluginsync_common::metadata::FileMetadata;

use super::error::{FetchError, Transient};

/// The most bytes of a listing body the agent reads, after gzip is undone
/// (docs/protocol.md §4.3): a real listing of 100,000 entries is ~40 MiB.
pub const MAX_LISTING_BYTES: usize = 256 << 20;

/// The most entries a listing may have (docs/protocol.md §4.3).
pub const MAX_LISTING_ENTRIES: usize = 250_000;

/// The most bytes of an error answer's body read for its message; the rest
/// is dropped with the connection.
pub const MAX_ERROR_BODY: usize = 64 << 10;

/// The most bytes of a node object read (docs/protocol.md §4.10): a node
/// with its facts and parameters is a few KiB; more is refused.
pub const MAX_NODE_BYTES: usize = 1 << 20;

/// The body of a 2xx answer, read chunk by chunk as it arrives.
#[derive(Debug)]
pub struct Body {
    response: reqwest::Response,
    received: u64,
}

impl Body {
    /// The body of `response`.
    pub(super) fn new(response: reqwest::Response) -> Body {
        Body {
            response,
            received: 0,
        }
    }

    /// The next chunk, `None` at the end; the error is a
    /// [`Transient::Cut`], `transfer cut after <n> bytes: …`.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, Transient> {
        match self.response.chunk().await {
            Ok(chunk) => {
                if let Some(c) = &chunk {
                    self.received += c.len() as u64;
                }
                Ok(chunk)
            }
            Err(e) => Err(Transient::Cut {
                received: self.received,
                cause: Box::new(Transient::of(&e)),
            }),
        }
    }
}

/// Why the consumer of a download's [`Body`] did not take it whole.
#[derive(Debug)]
pub enum BodyError {
    /// The transfer broke off: another attempt may do better.
    Cut(Transient),
    /// Anything else (the staged file cannot be written): the download
    /// fails with this.
    Refused(String),
    /// The bytes do not hash to the digest asked for: this server served
    /// bad content, another may serve the right bytes.
    Mismatch(String),
}

/// How much of a body [`read_capped`] read.
pub enum Capped {
    /// All of it.
    Whole(Bytes),
    /// The cap was reached: the rest is never read.
    Over,
}

/// Reads `resp`'s body (inflated, when the master gzipped it) up to `cap`
/// bytes. [`Capped::Over`] when there was more: the rest is never read
/// (the connection is dropped), so a gzip bomb or an endless body costs at
/// most `cap` bytes of memory. What was read before an error is lost.
pub async fn read_capped(
    mut resp: reqwest::Response,
    cap: usize,
) -> Result<Capped, reqwest::Error> {
    let mut body = Vec::new();
    loop {
        match resp.chunk().await? {
            Some(chunk) => {
                if body.len() + chunk.len() > cap {
                    return Ok(Capped::Over);
                }
                body.extend_from_slice(&chunk);
            }
            None => return Ok(Capped::Whole(Bytes::from(body))),
        }
    }
}

/// The first line of an error answer's body, at most [`MAX_ERROR_BODY`]
/// read of it (what was read, whatever broke off).
pub async fn error_body(mut resp: reqwest::Response) -> Bytes {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        if body.len() + chunk.len() > MAX_ERROR_BODY {
            let room = MAX_ERROR_BODY - body.len();
            body.extend_from_slice(&chunk[..room]);
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Bytes::from(body)
}

/// Parses a listing body: a JSON array of at most
/// [`MAX_LISTING_ENTRIES`] metadata objects (refused as soon as the one
/// after the last allowed is read, before it is kept).
pub fn parse_listing(server: &str, body: &[u8]) -> Result<Vec<FileMetadata>, FetchError> {
    serde_json::from_slice::<Listing>(body)
        .map(|c| c.0)
        .map_err(|detail| FetchError::Malformed {
            server: server.to_owned(),
            detail,
        })
}

/// A listing of at most [`MAX_LISTING_ENTRIES`] entries.
struct Listing(Vec<FileMetadata>);

impl<'de> serde::Deserialize<'de> for Listing {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Listing, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Listing;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON array of file metadata")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Listing, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(m) = seq.next_element::<FileMetadata>()? {
                    if out.len() == MAX_LISTING_ENTRIES {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_LISTING_ENTRIES} entries; refused"
                        )));
                    }
                    out.push(m);
                }
                Ok(Listing(out))
            }
        }
        d.deserialize_seq(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_with_too_many_entries_is_refused() {
        let entry = r#"{"path":"/m","relative_path":".","links":"follow","owner":0,"group":0,"mode":493,"checksum":{"type":"ctime","value":"{ctime}x"},"type":"directory","destination":null}"#;
        let body = |n: usize| format!("[{}]", vec![entry; n].join(","));
        let ok = parse_listing("s", body(MAX_LISTING_ENTRIES).as_bytes()).unwrap();
        assert_eq!(ok.len(), MAX_LISTING_ENTRIES);
        let e = parse_listing("s", body(MAX_LISTING_ENTRIES + 1).as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 250000 entries"), "{e}");
        assert!(parse_listing("s", b"{}").is_err());
    }
}
