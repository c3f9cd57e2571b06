//! Text from outside (file names, config values, a master's messages, a
//! loader's output) made safe for a terminal, a log or a cron mail: every
//! control character (C0, DEL, C1) and every bidirectional formatting
//! character becomes a visible escape (`\n`, `\r`, `\t`, `\x1b`,
//! `\u{202e}`), so a name can neither end a line (and forge a line after
//! it) nor send escape sequences to a terminal. The one escaper of both
//! binaries: config errors (`config.rs`) and every line the agent prints
//! (`agent/src/report.rs`).

use std::borrow::Cow;

fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` escaped as the module doc says; borrowed when it needs nothing.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) && (c as u32) < 0x100 => {
                // A C1 or C0 character: its code point is one byte.
                out.push_str("\\x");
                crate::hex::push(&mut out, &[c as u8]);
            }
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_become_visible() {
        assert_eq!(escape("plain.rb"), "plain.rb");
        assert_eq!(escape("a\nb\tc\r"), "a\\nb\\tc\\r");
        assert_eq!(escape("\u{1b}[2J"), "\\x1b[2J");
        assert_eq!(escape("x\u{202e}y"), "x\\u{202e}y");
    }
}
