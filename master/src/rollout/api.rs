//! The rollout calls of the admin API as they travel (docs/protocol.md
//! §7.9): their path and the status they answer, which the handlers
//! (`handlers/rollout.rs`) send and the `pluginsync-master rollout`
//! command (`rollout_client.rs`) reads.

use pluginsync_common::envname::EnvName;
use serde::{Deserialize, Serialize};

use super::{Command, Policy, Rollouts, status_of};
use crate::generations::{Generations, Kept};

/// The admin API path of the rollout calls.
pub const ROLLOUT_PATH: &str = "/pluginsync/v1/admin/rollout";

/// One kept generation in a rollout's status, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenerationStatus {
    /// The generation's id (64 hex).
    pub id: String,
    /// When this replica published it (RFC 3339).
    pub published: String,
    /// Rolled back, not served.
    pub withdrawn: bool,
    /// Everyone's (promoted).
    pub promoted: bool,
    /// What it is to the fleet, in words (docs/rollouts.md#commands):
    /// `everyone`, `base (everyone else)`, `N% open (wave K)`, `halted at
    /// N% open (wave K) since T: reason`, `rolled back`, `superseded`; a
    /// promoted one or the one rolled back to says so after a `;`. Empty
    /// from a master that predates it.
    #[serde(default)]
    pub state: String,
    /// Its deploy's label (r10k's `.r10k-deploy.json` signature), when
    /// the tree had one at publication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Share of the fleet its waves have opened (100 without a policy).
    pub open_percent: f64,
    /// Timed waves open (0 without a policy).
    pub waves_open: usize,
    /// Nodes that report having it (the whole fleet), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u64>,
    /// Of those, the nodes that report failing loads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_nodes: Option<u64>,
}

/// A rollout's status (`rollout status --format json` prints one per
/// master).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RolloutStatus {
    /// The environment.
    pub environment: String,
    /// Whether a `[[rollout]]` policy applies.
    pub policy: bool,
    /// No node moves.
    pub halted: bool,
    /// Why it halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The commands' logical clock.
    pub clock: u64,
    /// The kept generations, newest first.
    pub generations: Vec<GenerationStatus>,
    /// Why this replica runs degraded, if it does: its shared state store
    /// not answering (docs/rollouts.md#replicas); waves frozen meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
}

impl Rollouts {
    /// The status of `env`'s rollout.
    pub fn status(&self, gens: &Generations, env: &EnvName) -> RolloutStatus {
        let cmd = self.command(env);
        let policy = self.policy(env);
        let kept = gens.kept(env);
        let generations = (kept.iter().enumerate())
            .map(|(i, k)| {
                let (open_percent, waves_open) = status_of(policy, &cmd, k);
                let counts = self.fleet.get().map(|f| f.on_generation(env, &k.id));
                GenerationStatus {
                    id: k.id.to_hex(),
                    published: k.published.to_string(),
                    withdrawn: cmd.withdrawn.contains(&k.id),
                    promoted: cmd.promoted == Some(k.id),
                    state: state_of(&kept, i, policy, &cmd),
                    label: k.label.clone(),
                    open_percent,
                    waves_open,
                    nodes: counts.map(|c| c.0),
                    failing_nodes: counts.map(|c| c.1),
                }
            })
            .collect();
        RolloutStatus {
            environment: env.to_string(),
            policy: policy.is_some(),
            halted: cmd.halt.is_some(),
            reason: cmd.halt.map(|h| h.reason),
            clock: cmd.clock,
            generations,
            degraded: self.degraded(),
        }
    }
}

impl Rollouts {
    /// The rollout series of every environment with a policy and kept
    /// generations (docs/operating.md#master-metrics): the newest served
    /// generation's share (100 once it is everyone's), its wave, the halt.
    pub fn gauges(&self, gens: &Generations) -> Vec<crate::metrics::RolloutGauge> {
        let with_policy = gens.counts().into_iter().map(|(e, _)| e);
        (with_policy.filter_map(|e| Some((self.policy(&e)?, e))))
            .filter_map(|(policy, env)| {
                let (cmd, kept) = (self.command(&env), gens.kept(&env));
                kept.first()?;
                let i = (kept.iter().position(|k| !cmd.withdrawn.contains(&k.id))).unwrap_or(0);
                let (open, wave) = status_of(Some(policy), &cmd, &kept[i]);
                let everyone = state_of(&kept, i, Some(policy), &cmd).starts_with("everyone");
                Some(crate::metrics::RolloutGauge {
                    environment: env.to_string(),
                    open_percent: if everyone { 100.0 } else { open },
                    wave: wave as u64,
                    halted_since: cmd.halt.map_or(0, |h| h.at.0),
                })
            })
            .collect()
    }
}

/// What `kept[i]` (newest first) is to the fleet as `pick` places nodes
/// (docs/rollouts.md#commands): the newest generation served that is
/// promoted, fully open or the oldest served is everyone else's (the base
/// under newer waves); newer ones are in their waves (frozen while
/// halted); older ones reach no node.
fn state_of(kept: &[Kept], i: usize, policy: Option<&Policy>, cmd: &Command) -> String {
    let k = &kept[i];
    if cmd.withdrawn.contains(&k.id) {
        return "rolled back".to_owned();
    }
    let serving: Vec<usize> = (0..kept.len())
        .filter(|j| !cmd.withdrawn.contains(&kept[*j].id))
        .collect();
    let floor = serving.iter().copied().find(|&j| {
        Some(&j) == serving.last()
            || cmd.reaches_everyone(&kept[j].id)
            || status_of(policy, cmd, &kept[j]).0 >= 100.0
    });
    match floor {
        Some(f) if i < f => {
            let (open, wave) = status_of(policy, cmd, k);
            let share = format!("{open}% open (wave {wave})");
            match &cmd.halt {
                Some(h) => format!("halted at {share} since {}: {}", h.at, h.reason),
                None => share,
            }
        }
        Some(f) if i == f => {
            let whom = match serving.first() == Some(&f) {
                true => "everyone",
                false => "base (everyone else)",
            };
            // The newest served under a withdrawn one: where a rollback
            // returned (its nodes went back to what each had).
            let rolled_to = i > 0 && cmd.withdrawn.contains(&kept[i - 1].id);
            match (cmd.promoted == Some(k.id), rolled_to) {
                (_, true) => format!("{whom}; rolled back to"),
                (true, false) => format!("{whom}; promoted"),
                _ => whom.to_owned(),
            }
        }
        _ => "superseded".to_owned(),
    }
}
