//! The field escapes of a manifest line (docs/protocol.md §7.6): `%`,
//! space, DEL and control characters in a path or link target as `%XX`.

/// Escapes a path or link target for a manifest field: `%`, space, DEL
/// and every control byte become `%XX`; everything else stays.
pub fn escape_field(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_escaped(&mut out, s);
    out
}

/// [`escape_field`] of `s`, appended to `out`.
pub(super) fn push_escaped(out: &mut String, s: &str) {
    let escaped = |c: char| c == '%' || c == ' ' || c == '\u{7f}' || (c as u32) < 0x20;
    if !s.chars().any(escaped) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        if escaped(c) {
            // Every escaped character is ASCII: one byte, two digits.
            out.push('%');
            crate::hex::push_upper(out, &[c as u8]);
        } else {
            out.push(c);
        }
    }
}

/// The inverse of [`escape_field`]; `None` for a malformed escape or a
/// field that could not have been written by it.
pub fn unescape_field(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let v = crate::hex::byte(*b.get(i + 1)?, *b.get(i + 2)?)?;
                if !(v == b'%' || v == b' ' || v == 0x7f || v < 0x20) {
                    return None;
                }
                out.push(v);
                i += 3;
            }
            c if c == b' ' || c == 0x7f || c < 0x20 => return None,
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}
