//! `environment.conf`: an environment's own settings, read the way Puppet
//! reads them (docs/protocol.md §3.4).
//!
//! Puppet's format (`puppet/settings/ini_file.rb`, `config_file.rb`,
//! `value_translator.rb`, `environment_conf.rb` in Puppet 7):
//!
//! - one `key = value` per line; the key is word characters, spaces around
//!   `=` and at both ends of the line are dropped, the value may hold `=`;
//! - a line whose first non-blank character is `#` is a comment, a blank
//!   line is nothing; `#` later in a line is part of the value;
//! - one leading and one trailing quote (`"` or `'`) are removed from a
//!   value, each on its own (`"a'` is `a`);
//! - `{owner = x, group = y, mode = 0644}` in a value is Puppet's file
//!   metadata and is dropped; any other `{…}` makes Puppet refuse the line;
//! - `[main]` is the only section; settings under another section header
//!   are ignored (Puppet warns the same way);
//! - when a key is given twice, the first wins (Puppet's `Section#setting`);
//! - the keys are `modulepath`, `manifest`, `config_version`,
//!   `environment_timeout`, `environment_data_provider`, `static_catalogs`
//!   and `rich_data`. Only `modulepath` matters to pluginsync; the others
//!   are accepted and ignored, an unknown key is a warning.
//!
//! Puppet fails the whole environment on a malformed line; we skip the line
//! with a warning instead, so one typo does not take an environment's
//! plugins away from every node.
//!
//! [`parse`] is pure (text in, settings and warnings out) and
//! [`modulepath_entries`] is pure too (a `modulepath` value in, absolute
//! path patterns out); globbing and existence checks happen in
//! `environments.rs`.

use std::path::{Path, PathBuf};

/// The keys Puppet accepts in `environment.conf` besides `modulepath`
/// (`Puppet::Settings::EnvironmentConf::VALID_SETTINGS`).
const IGNORED_KEYS: [&str; 6] = [
    "manifest",
    "config_version",
    "environment_timeout",
    "environment_data_provider",
    "static_catalogs",
    "rich_data",
];

/// The settings of one `environment.conf` that pluginsync uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvConf {
    /// The `modulepath` value (quotes and file metadata removed) and its
    /// line number (1-based), when the file sets one.
    pub modulepath: Option<(String, usize)>,
}

/// Something in the file that is ignored, with its line (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The line number, from 1.
    pub line: usize,
    /// What is wrong and what was done about it.
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// Parses the text of an `environment.conf`. Never fails: everything that
/// cannot be used is a [`Warning`] and is otherwise ignored.
pub fn parse(text: &str) -> (EnvConf, Vec<Warning>) {
    let mut conf = EnvConf::default();
    let mut warnings = Vec::new();
    let mut in_main = true;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let mut warn = |message: String| warnings.push(Warning { line, message });
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Some(name) = trimmed
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .filter(|s| is_word(s))
        {
            in_main = name == "main";
            if !in_main {
                warn(format!(
                    "section [{name}]: environment.conf has no sections, its settings are ignored"
                ));
            }
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            warn(format!("not 'key = value', ignored: {}", shorten(trimmed)));
            continue;
        };
        let key = key.trim_end();
        if !is_word(key) {
            warn(format!(
                "'{}' is not a setting name, line ignored",
                shorten(key)
            ));
            continue;
        }
        if !in_main {
            continue;
        }
        let value = match strip_file_metadata(&unquote(value.trim())) {
            Ok(v) => v,
            Err(e) => {
                warn(format!("{key}: {e}, line ignored (Puppet refuses it too)"));
                continue;
            }
        };
        match key {
            "modulepath" => {
                if let Some((_, first)) = &conf.modulepath {
                    warn(format!(
                        "modulepath set again, ignored (the first, line {first}, wins)"
                    ));
                } else {
                    conf.modulepath = Some((value, line));
                }
            }
            k if IGNORED_KEYS.contains(&k) => {}
            other => warn(format!("unknown setting '{other}', ignored")),
        }
    }
    (conf, warnings)
}

/// Ruby's `[[:word:]]+`: letters, digits, underscore.
fn is_word(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// At most 60 characters of `s`, for messages.
fn shorten(s: &str) -> String {
    if s.chars().count() <= 60 {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(60).collect::<String>())
    }
}

/// `value.gsub(/^["']|["']$/, '').sub(/\s+$/, '')` (Puppet's
/// `ValueTranslator`): one leading and one trailing quote, independently.
fn unquote(value: &str) -> String {
    let v = value.strip_prefix(['"', '\'']).unwrap_or(value);
    let v = v.strip_suffix(['"', '\'']).unwrap_or(v);
    v.trim_end().to_owned()
}

/// Braces in a value that are not Puppet's file metadata: the braces, at
/// most 60 characters of them.
#[derive(Debug, thiserror::Error)]
#[error("cannot parse '{0}' (braces hold only owner, group and mode)")]
struct NotFileMetadata(String);

/// Puppet's `extract_fileinfo`: the first `{…}` must be
/// `owner|group|mode = word` pairs (dropped: file metadata for Puppet's
/// own settings); anything else is an error.
fn strip_file_metadata(value: &str) -> Result<String, NotFileMetadata> {
    let Some(open) = value.find('{') else {
        return Ok(value.to_owned());
    };
    let Some(close) = value[open..].find('}').map(|c| open + c) else {
        return Ok(value.to_owned());
    };
    let inner = value[open + 1..close].trim();
    if inner.is_empty() {
        return Ok(value.to_owned());
    }
    for param in inner.split(',') {
        let ok = param.split_once('=').is_some_and(|(k, v)| {
            let (k, v) = (k.trim(), v.trim());
            ["owner", "group", "mode"].contains(&k)
                && is_word(v)
                && (k != "mode" || v.bytes().all(|b| b.is_ascii_digit()))
        });
        if !ok {
            return Err(NotFileMetadata(shorten(&value[open..=close])));
        }
    }
    let mut out = String::with_capacity(value.len());
    out.push_str(&value[..open]);
    out.push_str(&value[close + 1..]);
    Ok(out.trim_end().to_owned())
}

/// The entries of a `modulepath` value, in order, as absolute paths that
/// may still hold glob characters (`*`, `?`, `[`): split on `:`, then
/// `$basemodulepath` / `${basemodulepath}` replaced by the master's
/// `basemodulepath` (its entries, in order) and `$environment` /
/// `${environment}` by `env_name` (Puppet's settings interpolation), then
/// relative entries made relative to `env_dir`. Empty entries and entries
/// naming another variable are left out with a message each.
pub fn modulepath_entries(
    value: &str,
    env_dir: &Path,
    env_name: &str,
    basemodulepath: &[PathBuf],
) -> (Vec<PathBuf>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    if value.trim().is_empty() {
        problems.push("modulepath is empty: this environment serves no modules".to_owned());
        return (out, problems);
    }
    for raw in value.split(':') {
        let entry = raw.trim();
        if entry.is_empty() {
            problems.push("an empty modulepath entry is left out".to_owned());
            continue;
        }
        if matches!(entry, "$basemodulepath" | "${basemodulepath}") {
            out.extend(basemodulepath.iter().cloned());
            continue;
        }
        match interpolate(entry, env_name) {
            Ok(p) => {
                let p = PathBuf::from(p);
                out.push(if p.is_absolute() { p } else { env_dir.join(p) });
            }
            Err(UnknownVariable(var)) => problems.push(format!(
                "modulepath entry '{entry}' left out: ${var} is not known here \
                 (pluginsync interpolates $basemodulepath, as a whole entry, and $environment)"
            )),
        }
    }
    (out, problems)
}

/// A `$name` in a modulepath entry other than `$environment`: the name
/// (what follows `$`, up to the end of the entry for an unclosed `${`).
#[derive(Debug, PartialEq, Eq)]
struct UnknownVariable(String);

/// Replaces `$environment` and `${environment}` with `env_name`; any other
/// `$name` is an error naming it.
fn interpolate(entry: &str, env_name: &str) -> Result<String, UnknownVariable> {
    let mut out = String::with_capacity(entry.len());
    let mut rest = entry;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => (&braced[..end], end + 2),
                None => return Err(UnknownVariable(after.to_owned())),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        if name != "environment" {
            return Err(UnknownVariable(name.to_owned()));
        }
        out.push_str(env_name);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// True when an entry holds glob characters (Puppet's `expand_glob` test,
/// without `{`: braces never get past the parser).
pub fn is_glob(entry: &Path) -> bool {
    entry.to_string_lossy().contains(['*', '?', '['])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mp(text: &str) -> Option<String> {
        parse(text).0.modulepath.map(|(v, _)| v)
    }

    #[test]
    fn puppets_line_rules() {
        assert_eq!(mp("modulepath=a:b"), Some("a:b".into()));
        assert_eq!(mp("  modulepath   =   a:b   \n"), Some("a:b".into()));
        assert_eq!(
            mp("modulepath = \"site:modules\""),
            Some("site:modules".into())
        );
        assert_eq!(mp("modulepath = 'a\""), Some("a".into()));
        assert_eq!(mp("modulepath = a=b"), Some("a=b".into()));
        assert_eq!(
            mp("modulepath = a # not a comment"),
            Some("a # not a comment".into())
        );
        assert_eq!(
            mp("# modulepath = a\n\n   # x\nmodulepath = b"),
            Some("b".into())
        );
        assert_eq!(mp("[main]\nmodulepath = a"), Some("a".into()));
        assert_eq!(
            mp("modulepath = a {owner = root, mode = 0644}"),
            Some("a".into())
        );
        assert_eq!(mp("modulepath = \r"), Some("".into()));
        assert_eq!(mp("manifest = site.pp"), None);
    }

    #[test]
    fn first_setting_wins_and_other_sections_are_ignored() {
        let (c, w) = parse("modulepath = a\nmodulepath = b\n");
        assert_eq!(c.modulepath, Some(("a".into(), 1)));
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].line, 2);
        let (c, w) = parse("[agent]\nmodulepath = a\n[main]\nmodulepath = b\n");
        assert_eq!(c.modulepath, Some(("b".into(), 4)));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].message.contains("[agent]"), "{w:?}");
    }

    #[test]
    fn known_keys_are_quiet_unknown_and_malformed_lines_warn_once_each() {
        let text = "manifest = site.pp\nconfig_version = scripts/v.sh $environment\n\
                    environment_timeout = unlimited\nstatic_catalogs = false\nrich_data = true\n\
                    environment_data_provider = hiera\n";
        assert_eq!(parse(text).1, vec![]);
        let (c, w) = parse(
            "modulepth = a\njust words\n; ini comment\nbad key = 1\nmodulepath = {x}\nmodulepath = m\n",
        );
        assert_eq!(c.modulepath, Some(("m".into(), 6)));
        let lines: Vec<usize> = w.iter().map(|w| w.line).collect();
        assert_eq!(lines, vec![1, 2, 3, 4, 5], "{w:?}");
        assert!(
            w[0].message.contains("unknown setting 'modulepth'"),
            "{w:?}"
        );
        assert!(w[4].message.contains("braces"), "{w:?}");
    }

    #[test]
    fn entries_expand_relative_and_variables() {
        let env = Path::new("/envs/production");
        let base = [PathBuf::from("/base/one"), PathBuf::from("/base/two")];
        let (e, p) = modulepath_entries(
            "site-modules:modules:/abs/x:${environment}_mods:$basemodulepath:dist/*",
            env,
            "production",
            &base,
        );
        assert_eq!(p, Vec::<String>::new());
        let e: Vec<_> = e.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            e,
            vec![
                "/envs/production/site-modules",
                "/envs/production/modules",
                "/abs/x",
                "/envs/production/production_mods",
                "/base/one",
                "/base/two",
                "/envs/production/dist/*",
            ]
        );
        let (e, p) = modulepath_entries("a::$codedir/m:${x", env, "production", &base);
        assert_eq!(e, vec![PathBuf::from("/envs/production/a")]);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[1].contains("$codedir"), "{p:?}");
        let (e, p) = modulepath_entries("", env, "production", &base);
        assert!(e.is_empty() && p.len() == 1);
    }

    /// Every text of up to four characters over the characters that matter
    /// to the parser, alone and as a `modulepath` value: no panic, and every warning names a line of the text.
    #[test]
    fn never_panics_on_any_short_text() {
        const ALPHABET: [char; 13] = [
            'm', '=', '[', ']', '{', '}', '$', '"', '#', ' ', '\n', ':', '*',
        ];
        let mut text = String::new();
        let n = ALPHABET.len();
        for len in 0..=4u32 {
            for mut code in 0..n.pow(len) {
                text.clear();
                for _ in 0..len {
                    text.push(ALPHABET[code % n]);
                    code /= n;
                }
                for text in [text.clone(), format!("modulepath ={text}")] {
                    let (c, warnings) = parse(&text);
                    let lines = text.lines().count();
                    assert!(
                        warnings.iter().all(|w| w.line >= 1 && w.line <= lines),
                        "{text:?}"
                    );
                    if let Some((v, _)) = c.modulepath {
                        let _ = modulepath_entries(&v, Path::new("/e"), "e", &[]);
                    }
                }
            }
        }
    }

    #[test]
    fn never_panics_on_odd_text() {
        let samples = [
            "\u{0}=\u{0}",
            "[",
            "]",
            "[]",
            "=",
            "==",
            "{",
            "}",
            "a={",
            "a=}{",
            "modulepath={}",
            "modulepath={ owner = }",
            "modulepath=\"",
            "modulepath='",
            "ü = ß",
            "[ü]",
            "modulepath = ${",
            "modulepath = $",
            "\u{feff}modulepath = a",
            "\r\n\r\n",
        ];
        for s in samples {
            let (c, _) = parse(s);
            if let Some((v, _)) = c.modulepath {
                let _ = modulepath_entries(&v, Path::new("/e"), "e", &[]);
            }
        }
    }
}
