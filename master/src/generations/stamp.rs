//! [`Stamp`]: a moment to the second, the one time type of generations and
//! rollouts (docs/rollouts.md#placement): a generation's publication, a
//! halt, the moment a node is placed. Held as unix seconds, so a placement
//! compares integers; written RFC 3339 UTC where a file or the wire holds
//! it (a generation's record, the per-node answer, a bundle's header),
//! parsed once, where it is read.

use std::time::Duration;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A moment, unix seconds. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(pub i64);

/// Text that is not an RFC 3339 time.
#[derive(Debug, thiserror::Error)]
#[error("not an RFC 3339 time: '{0}'")]
pub struct BadStamp(String);

impl Stamp {
    /// Now, to the second.
    pub fn now() -> Stamp {
        Stamp(OffsetDateTime::now_utc().unix_timestamp())
    }

    /// The time from `earlier` to this moment; `None` when `earlier` is
    /// later.
    pub fn since(self, earlier: Stamp) -> Option<Duration> {
        u64::try_from(self.0 - earlier.0)
            .ok()
            .map(Duration::from_secs)
    }
}

impl std::str::FromStr for Stamp {
    type Err = BadStamp;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OffsetDateTime::parse(s, &Rfc3339)
            .map(|t| Stamp(t.unix_timestamp()))
            .map_err(|_| BadStamp(s.to_owned()))
    }
}

/// RFC 3339, UTC (`2026-01-02T03:04:05Z`).
impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = OffsetDateTime::from_unix_timestamp(self.0).unwrap_or(OffsetDateTime::UNIX_EPOCH);
        let text = t.format(&Rfc3339).map_err(|_| std::fmt::Error)?;
        f.write_str(&text)
    }
}

impl serde::Serialize for Stamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Stamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_as_it_was_read() {
        let s: Stamp = "2026-01-02T03:04:05Z".parse().unwrap();
        assert_eq!(s.to_string(), "2026-01-02T03:04:05Z");
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            "\"2026-01-02T03:04:05Z\""
        );
        let back: Stamp = serde_json::from_str("\"2026-01-02T03:04:05Z\"").unwrap();
        assert_eq!(back, s);
        assert_eq!(Stamp(60).since(Stamp(0)), Some(Duration::from_secs(60)));
        assert_eq!(Stamp(0).since(Stamp(60)), None);
        assert!("yesterday".parse::<Stamp>().is_err());
    }
}
