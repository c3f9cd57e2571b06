//! `[[rollout]]` (docs/rollouts.md#the-policy): which environments roll
//! a new generation out in waves, the waves, and the health gate; parsed
//! by serde with the rest of master.toml and checked here, so `serve` and
//! `check` refuse a bad policy with the same one line.

use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};
use pluginsync_common::config::ConfigError;
use serde::Deserialize;

/// One `[[rollout]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutRule {
    /// Globs on environment names, as `[[authorization]]` environments.
    pub environments: Vec<String>,
    /// The waves, in order; the last opens 100 percent.
    pub waves: Vec<WaveSpec>,
    /// The health gate; absent: the rollout never halts by itself.
    #[serde(default)]
    pub halt_on_load_failures: Option<HaltOn>,
}

/// One wave: opens `percent` of the fleet `after` the generation's
/// publication, or, with `promote = true`, only on `rollout promote`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaveSpec {
    /// Delay from the publication (`"30m"`); absent for a promote wave.
    #[serde(default, with = "humantime_serde")]
    pub after: Option<Duration>,
    /// Share of the fleet this wave includes (cumulative), in (0, 100].
    pub percent: f64,
    /// An operator-gated wave: it and every later one wait for
    /// `rollout promote`.
    #[serde(default)]
    pub promote: bool,
}

/// `halt_on_load_failures`: halt when at least `min_nodes` nodes, and at
/// least `percent` of the nodes, on the new generation report failing
/// loads (counted over the whole fleet).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HaltOn {
    /// Share of the nodes on the generation, in (0, 100].
    pub percent: f64,
    /// Failing nodes at least; 2 by default, so one node (one
    /// certificate) never halts a rollout alone
    /// (docs/rollouts.md#the-health-gate).
    #[serde(default = "two")]
    pub min_nodes: u64,
}

fn two() -> u64 {
    2
}

impl HaltOn {
    /// Whether `failing` of `nodes` trips the gate.
    pub fn trips(&self, nodes: u64, failing: u64) -> bool {
        nodes > 0
            && failing >= self.min_nodes.max(1)
            && failing as f64 * 100.0 >= self.percent * nodes as f64
    }
}

/// One environment's policy, checked.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Timed waves `(after, percent)`, in order, before any promote wave.
    pub timed: Vec<(Duration, f64)>,
    /// The health gate.
    pub halt_on: Option<HaltOn>,
}

impl Policy {
    /// The share of the fleet open `elapsed` after the publication
    /// (`None`: before it); a promoted generation is everyone's.
    pub fn open_percent(&self, elapsed: Option<Duration>) -> f64 {
        let Some(elapsed) = elapsed else {
            return 0.0;
        };
        self.timed
            .iter()
            .filter(|(after, _)| *after <= elapsed)
            .map(|(_, p)| *p)
            .fold(0.0, f64::max)
    }

    /// The index of the last timed wave open at `elapsed` (1-based; 0 for
    /// none), for status.
    pub fn waves_open(&self, elapsed: Option<Duration>) -> usize {
        elapsed.map_or(0, |e| self.timed.iter().filter(|(a, _)| *a <= e).count())
    }
}

/// Every `[[rollout]]` rule, compiled: which policy an environment has.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    rules: Vec<(GlobSet, Policy)>,
}

fn invalid(i: usize, what: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid(format!("[[rollout]] #{}: {what}", i + 1))
}

/// Whether a glob pattern has no wildcard: it names one environment.
fn literal(pattern: &str) -> bool {
    !pattern.contains(['*', '?', '[', '{', '\\'])
}

impl Policies {
    /// Checks and compiles the rules; the first problem is one line
    /// naming the rule (1-based) and what is wrong.
    pub fn new(rules: &[RolloutRule]) -> Result<Policies, ConfigError> {
        let mut compiled = Vec::with_capacity(rules.len());
        for (i, rule) in rules.iter().enumerate() {
            let policy = check_waves(i, rule)?;
            if rule.environments.is_empty() {
                return Err(invalid(i, "environments names no environment"));
            }
            let mut set = GlobSetBuilder::new();
            for e in &rule.environments {
                set.add(Glob::new(e).map_err(|err| {
                    invalid(i, format_args!("environments glob '{e}': {}", err.kind()))
                })?);
            }
            let set = set
                .build()
                .map_err(|e| invalid(i, format_args!("environments: {e}")))?;
            compiled.push((set, policy));
        }
        for (i, rule) in rules.iter().enumerate() {
            for (j, other) in rules.iter().enumerate().filter(|(j, _)| *j != i) {
                let twice = rule.environments.iter().find(|p| {
                    other.environments.contains(p) || (literal(p) && compiled[j].0.is_match(p))
                });
                if let Some(p) = twice {
                    return Err(invalid(
                        i,
                        format_args!(
                            "environment '{p}' is also matched by [[rollout]] #{}",
                            j + 1
                        ),
                    ));
                }
            }
        }
        Ok(Policies { rules: compiled })
    }

    /// The policy of `environment`, if a rule matches it.
    pub fn of(&self, environment: &str) -> Option<&Policy> {
        self.rules
            .iter()
            .find(|(set, _)| set.is_match(environment))
            .map(|(_, p)| p)
    }

    /// Whether any rule is configured.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// The waves of rule `i`: shares increase, the last is 100, `after` does
/// not decrease, promote waves come last and have no `after`.
fn check_waves(i: usize, rule: &RolloutRule) -> Result<Policy, ConfigError> {
    let Some(last) = rule.waves.last() else {
        return Err(invalid(i, "waves names no wave"));
    };
    let mut timed = Vec::new();
    let mut previous: Option<&WaveSpec> = None;
    for w in &rule.waves {
        if !(w.percent > 0.0 && w.percent <= 100.0) {
            return Err(invalid(
                i,
                format_args!("wave percent {} is not in (0, 100]", w.percent),
            ));
        }
        match (w.promote, w.after, previous) {
            (true, Some(_), _) => {
                return Err(invalid(i, "a promote wave has no after"));
            }
            (false, None, _) => return Err(invalid(i, "a wave needs after (or promote = true)")),
            (false, Some(_), Some(p)) if p.promote => {
                return Err(invalid(i, "a timed wave after a promote wave"));
            }
            _ => {}
        }
        if let Some(p) = previous {
            if w.percent <= p.percent {
                return Err(invalid(
                    i,
                    format_args!(
                        "wave shares must increase ({} then {})",
                        p.percent, w.percent
                    ),
                ));
            }
            if let (Some(a), Some(b)) = (p.after, w.after)
                && b < a
            {
                return Err(invalid(
                    i,
                    format_args!(
                        "wave after must not decrease ({} then {})",
                        humantime_serde::re::humantime::format_duration(a),
                        humantime_serde::re::humantime::format_duration(b)
                    ),
                ));
            }
        }
        if let Some(a) = w.after {
            timed.push((a, w.percent));
        }
        previous = Some(w);
    }
    if last.percent < 100.0 {
        return Err(invalid(
            i,
            format_args!("the last wave opens {} percent, not 100", last.percent),
        ));
    }
    if let Some(h) = rule.halt_on_load_failures
        && !(h.percent > 0.0 && h.percent <= 100.0)
    {
        return Err(invalid(
            i,
            format_args!(
                "halt_on_load_failures.percent {} is not in (0, 100]",
                h.percent
            ),
        ));
    }
    Ok(Policy {
        timed,
        halt_on: rule.halt_on_load_failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<Policies, String> {
        #[derive(Deserialize)]
        struct Doc {
            rollout: Vec<RolloutRule>,
        }
        let doc: Doc = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        Policies::new(&doc.rollout).map_err(|e| e.to_string())
    }

    const GOOD: &str = r#"
[[rollout]]
environments = ["production", "prod_*"]
waves = [ { after = "0s", percent = 5 }, { after = "30m", percent = 25 }, { after = "2h", percent = 100 } ]
halt_on_load_failures = { percent = 2, min_nodes = 3 }
"#;

    #[test]
    fn a_policy_parses_and_opens_its_waves_in_time() {
        let p = parse(GOOD).unwrap();
        let pol = p.of("prod_eu").unwrap();
        assert!(p.of("staging").is_none());
        let m = |s| Some(Duration::from_secs(s));
        assert_eq!(pol.open_percent(None), 0.0);
        assert_eq!(pol.open_percent(m(0)), 5.0);
        assert_eq!(pol.open_percent(m(1799)), 5.0);
        assert_eq!(pol.open_percent(m(1800)), 25.0);
        assert_eq!(pol.open_percent(m(7200)), 100.0);
        assert_eq!(pol.waves_open(m(1800)), 2);
        let gate = pol.halt_on.unwrap();
        assert!(!gate.trips(100, 2), "under min_nodes");
        assert!(gate.trips(100, 3));
        assert!(!gate.trips(1000, 3), "under 2 percent");
        assert!(!gate.trips(0, 0));
        let default = parse(&GOOD.replace(", min_nodes = 3", "")).unwrap();
        let gate = default.of("production").unwrap().halt_on.unwrap();
        assert_eq!(gate.min_nodes, 2);
        assert!(!gate.trips(1, 1), "one node never halts alone");
        assert!(gate.trips(2, 2));
    }

    #[test]
    fn bad_policies_are_one_line_naming_the_rule() {
        let cases = [
            (
                "waves = [ { after = \"0s\", percent = 25 }, { after = \"1m\", percent = 25 }, { after = \"2m\", percent = 100 } ]",
                "shares must increase (25 then 25)",
            ),
            (
                "waves = [ { after = \"0s\", percent = 5 }, { after = \"1m\", percent = 50 } ]",
                "not 100",
            ),
            (
                "waves = [ { after = \"1h\", percent = 5 }, { after = \"1m\", percent = 100 } ]",
                "must not decrease (1h then 1m)",
            ),
            ("waves = []", "names no wave"),
            ("waves = [ { percent = 100 } ]", "needs after"),
            (
                "waves = [ { promote = true, percent = 100 }, { after = \"1m\", percent = 100 } ]",
                "a timed wave after a promote wave",
            ),
        ];
        for (waves, want) in cases {
            let text = format!("[[rollout]]\nenvironments = [\"production\"]\n{waves}\n");
            let e = parse(&text).unwrap_err();
            assert!(e.contains(want), "{waves}: {e}");
            assert!(!e.trim_end().contains('\n'), "one line: {e}");
        }
        let twice = format!(
            "{GOOD}\n[[rollout]]\nenvironments = [\"prod_eu\"]\nwaves = [ {{ after = \"0s\", percent = 100 }} ]\n"
        );
        let e = parse(&twice).unwrap_err();
        assert!(
            e.contains("'prod_eu' is also matched by [[rollout]] #1"),
            "{e}"
        );
    }

    #[test]
    fn a_promote_wave_waits_for_the_operator() {
        let p = parse("[[rollout]]\nenvironments = [\"*\"]\nwaves = [ { after = \"0s\", percent = 10 }, { promote = true, percent = 100 } ]\n").unwrap();
        let pol = p.of("anything").unwrap();
        assert_eq!(pol.open_percent(Some(Duration::from_secs(1 << 30))), 10.0);
    }
}
