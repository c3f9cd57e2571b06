//! The path part of `file_content` URLs, encoded the way Puppet's agent does
//! and decoded the way Puppet Server does.
//!
//! The agent sends `relative_path` with one layer of RFC 2396 escaping
//! (docs/protocol.md §1.5): unreserved and reserved characters stay literal, every
//! other byte becomes `%XX`. We differ in one place on purpose: `?` is
//! escaped, because Puppet's agent sends it raw and so cannot sync a file
//! with `?` in its name. The master decodes exactly once, as UTF-8, and never
//! turns `+` into a space.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// Bytes left literal in a path: RFC 2396 unreserved and reserved marks, and
/// `/`; `?`, `#`, `%` and everything non-ASCII are escaped.
const PATH_KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')')
    .remove(b';')
    .remove(b'/')
    .remove(b':')
    .remove(b'@')
    .remove(b'&')
    .remove(b'=')
    .remove(b'+')
    .remove(b'$')
    .remove(b',')
    .remove(b'[')
    .remove(b']');

/// Escapes a relative path for use after `/file_content/<mount>/`.
pub fn encode_path(relative_path: &str) -> String {
    utf8_percent_encode(relative_path, PATH_KEEP).to_string()
}

/// Escapes a query value as Puppet does (`CGI.escape`, then `+` → `%20`).
pub fn encode_query_value(value: &str) -> String {
    const QUERY_KEEP: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    utf8_percent_encode(value, QUERY_KEEP).to_string()
}

/// The decoded path was not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request path is not valid UTF-8 after percent-decoding")]
pub struct NotUtf8;

/// Percent-decodes a raw request path once, as UTF-8.
pub fn decode_path(raw: &str) -> Result<String, NotUtf8> {
    percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_puppet_lab_observations() {
        assert_eq!(
            encode_path("facter/with space.rb"),
            "facter/with%20space.rb"
        );
        assert_eq!(encode_path("ünï.rb"), "%C3%BCn%C3%AF.rb");
        assert_eq!(encode_path("a+b;c#d%e"), "a+b;c%23d%25e");
        assert_eq!(encode_path("q?m.rb"), "q%3Fm.rb");
        assert_eq!(encode_query_value("a b*c"), "a%20b%2Ac");
    }

    #[test]
    fn decodes_once() {
        assert_eq!(decode_path("with%20space.rb").unwrap(), "with space.rb");
        assert_eq!(decode_path("a+b").unwrap(), "a+b");
        assert_eq!(decode_path("%252e%252e").unwrap(), "%2e%2e");
        assert_eq!(decode_path("%2e%2e/x").unwrap(), "../x");
        assert_eq!(decode_path("%FF").unwrap_err(), NotUtf8);
        for p in ["with space.rb", "ünï.rb", "a+b;c#d%e", "q?m.rb"] {
            assert_eq!(decode_path(&encode_path(p)).unwrap(), p);
        }
    }
}
