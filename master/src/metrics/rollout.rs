//! The rollout series (docs/operating.md#master-metrics), written as text
//! at each scrape like the fleet's: per environment with a `[[rollout]]`
//! policy, the share the newest served generation's waves have opened,
//! its wave, and since when the rollout is halted; and, under `[trust]
//! root`, the kept generations by signature state, the set a rollout
//! chooses from (docs/trust.md#publishing-only-signed-generations).

use std::fmt::Write;

/// One environment's rollout, read at scrape time.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RolloutGauge {
    /// The environment.
    pub environment: String,
    /// Share of the fleet the newest served generation has reached (100:
    /// everyone's).
    pub open_percent: f64,
    /// Its timed waves open.
    pub wave: u64,
    /// When the rollout halted (Unix seconds); 0 while it is not.
    pub halted_since: i64,
}

/// The series' names, help texts and values.
type Series = (&'static str, &'static str, fn(&RolloutGauge) -> f64);

const SERIES: [Series; 3] = [
    (
        "pluginsync_rollout_open_percent",
        "Share of the fleet (percent) the newest served generation has reached, by environment.",
        |g| g.open_percent,
    ),
    (
        "pluginsync_rollout_wave",
        "Timed waves open of the newest served generation, by environment.",
        |g| g.wave as f64,
    ),
    (
        "pluginsync_rollout_halted_since_timestamp_seconds",
        "When the rollout halted (Unix seconds), 0 while it is not halted, by environment.",
        |g| g.halted_since as f64,
    ),
];

/// Appends the rollout series for `gauges` to `text`.
pub(super) fn rollout_series(text: &mut String, gauges: &[RolloutGauge]) {
    if gauges.is_empty() {
        return;
    }
    for (name, help, value) in SERIES {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
        for g in gauges {
            let _ = writeln!(
                text,
                "{name}{{environment=\"{}\"}} {}",
                g.environment,
                value(g)
            );
        }
        text.push('\n');
    }
}

/// Appends `pluginsync_master_generations{environment,state}` for
/// `states` (each environment's kept generations by `signed`, `unsigned`,
/// `expired`) to `text`; nothing when empty (no `[trust] root`).
pub(super) fn generation_states_series(text: &mut String, states: &[(String, [(&str, u64); 3])]) {
    if states.is_empty() {
        return;
    }
    let name = "pluginsync_master_generations";
    let help = "Under [trust] root: generations kept, by environment and state (signed, unsigned, expired).";
    let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
    for (env, counts) in states {
        for (state, n) in counts {
            let _ = writeln!(
                text,
                "{name}{{environment=\"{env}\",state=\"{state}\"}} {n}"
            );
        }
    }
    text.push('\n');
}
