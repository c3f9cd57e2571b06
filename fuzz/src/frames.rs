//! A reference for the batch frame format (docs/protocol.md §7.2): the
//! whole stream parsed at once, no incremental state, so the frames target
//! can check that [`pluginsync_common::protocol::FrameDecoder`] says the
//! same thing whatever the chunking, and how many bytes each header took
//! (to bound what the decoder holds back).

use pluginsync_common::digest::Sha256;
use pluginsync_common::protocol::{FrameError, MAX_FRAME_HEADER};

/// One frame of a batch answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `<hex> -`: the master does not have it.
    Missing(Sha256),
    /// `<hex> <len>` and the bytes that followed (fewer than `len` if the
    /// stream ended inside it).
    Blob {
        /// The digest in the header.
        digest: Sha256,
        /// The length in the header.
        len: u64,
        /// The content bytes received.
        data: Vec<u8>,
        /// True once all `len` bytes arrived.
        complete: bool,
    },
}

/// What a whole stream says: its frames, the byte length of each frame's
/// header, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The frames, in order.
    pub frames: Vec<Frame>,
    /// The length of each frame's header line, newline included.
    pub header_lens: Vec<usize>,
    /// `Ok` if the stream ended between frames.
    pub end: Result<(), FrameError>,
}

/// Parses a whole batch answer.
pub fn parse(stream: &[u8]) -> Parsed {
    let mut frames = Vec::new();
    let mut header_lens = Vec::new();
    let mut pos = 0;
    let end = loop {
        if pos == stream.len() {
            break Ok(());
        }
        let rest = &stream[pos..];
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            break Err(if rest.len() > MAX_FRAME_HEADER {
                FrameError::HeaderTooLong
            } else {
                FrameError::Truncated
            });
        };
        if nl + 1 > MAX_FRAME_HEADER {
            break Err(FrameError::HeaderTooLong);
        }
        let line = &rest[..nl];
        let bad = FrameError::BadHeader(String::from_utf8_lossy(line).into_owned());
        let Ok(text) = std::str::from_utf8(line) else {
            break Err(bad);
        };
        let Some((hex, len)) = text.split_once(' ') else {
            break Err(bad);
        };
        let Ok(digest) = Sha256::from_hex(hex) else {
            break Err(bad);
        };
        pos += nl + 1;
        if len == "-" {
            frames.push(Frame::Missing(digest));
            header_lens.push(nl + 1);
            continue;
        }
        if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
            break Err(bad);
        }
        let Ok(len) = len.parse::<u64>() else {
            break Err(bad);
        };
        header_lens.push(nl + 1);
        let avail = (stream.len() - pos) as u64;
        let take = len.min(avail) as usize;
        frames.push(Frame::Blob {
            digest,
            len,
            data: stream[pos..pos + take].to_vec(),
            complete: take as u64 == len,
        });
        pos += take;
        if (take as u64) < len {
            break Err(FrameError::Truncated);
        }
    };
    Parsed {
        frames,
        header_lens,
        end,
    }
}
