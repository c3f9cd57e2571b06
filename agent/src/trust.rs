//! Signed generations on the node (docs/trust.md#what-a-node-verifies):
//! the TUF metadata fetched from the masters over the agent's own mTLS
//! client ([`MasterTransport`]), for `common`'s `trust::load`.

use std::time::Duration;

use tough::{Bytes, Transport, TransportError, TransportErrorKind, TransportStream, async_trait};

/// The largest metadata file the agent reads (the master serves no
/// larger, `master/src/trust/metadata.rs`); tough bounds each role
/// tighter where its limits say so.
const MAX_METADATA_BYTES: usize = 32 << 20;

/// How long one metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(60);

/// tough's transport over the agent's HTTP client: a 404 is "not found"
/// (how TUF learns there is no newer root), anything but a 200 an error.
#[derive(Debug, Clone)]
pub struct MasterTransport {
    http: reqwest::Client,
}

impl MasterTransport {
    /// Over `http` (the agent's mTLS client).
    pub fn new(http: reqwest::Client) -> MasterTransport {
        MasterTransport { http }
    }
}

#[async_trait]
impl Transport for MasterTransport {
    async fn fetch(&self, url: url::Url) -> Result<TransportStream, TransportError> {
        let fail = |kind, e: String| TransportError::new_with_cause(kind, url.clone(), e);
        let resp = self
            .http
            .get(url.as_str())
            .timeout(METADATA_TIMEOUT)
            .send()
            .await
            .map_err(|e| fail(TransportErrorKind::Other, e.to_string()))?;
        match resp.status().as_u16() {
            200 => {}
            404 => return Err(TransportError::new(TransportErrorKind::FileNotFound, url)),
            s => return Err(fail(TransportErrorKind::Other, format!("HTTP {s}"))),
        }
        let mut body = Vec::new();
        let mut resp = resp;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| fail(TransportErrorKind::Other, e.to_string()))?
        {
            if body.len() + chunk.len() > MAX_METADATA_BYTES {
                return Err(fail(
                    TransportErrorKind::Other,
                    format!("larger than {MAX_METADATA_BYTES} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let one: Result<Bytes, TransportError> = Ok(Bytes::from(body));
        Ok(Box::pin(futures_util::stream::iter([one])))
    }
}
