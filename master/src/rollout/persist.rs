//! The commands' state in the state store (`statestore/`,
//! docs/rollouts.md#where-the-state-lives): read at start, each command
//! written as one transaction with its history row. A `rollout.json` left
//! by an earlier master is imported once, at the first start on the
//! store, and renamed `rollout.json.imported`, so an upgrade loses no
//! halt, promotion or withdrawal. Replicas sharing a database read it back
//! each second (`Rollouts::refresh`).

use std::collections::BTreeMap;
use std::path::Path;

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use serde::{Deserialize, Serialize};

use super::{Command, Halt};
use crate::generations::Stamp;
use crate::statestore::{CommandRow, ORIGIN_KEY, StateStore, StoreError};
use pluginsync_common::mutex::lock;

/// The state file earlier masters kept under `[generations] dir`.
pub(super) const STATE_FILE: &str = "rollout.json";
/// What it is renamed to once imported.
const IMPORTED: &str = "rollout.json.imported";

/// The commands' state as this master holds it (and as `rollout.json`
/// held it).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Persisted {
    /// This replica's name for [`Command::origin`].
    pub origin: String,
    pub environments: BTreeMap<EnvName, Command>,
    /// Generations this replica has kept, per environment (newest last).
    #[serde(default)]
    pub seen: BTreeMap<EnvName, Vec<GenerationId>>,
}

/// `c` of `env` as the store's row.
pub(super) fn row_of(env: &EnvName, c: &Command) -> CommandRow {
    CommandRow {
        environment: env.to_string(),
        clock: c.clock,
        origin: c.origin.clone(),
        halt: c.halt.as_ref().map(|h| (h.at.0, h.reason.clone())),
        promoted: c.promoted,
        withdrawn: c.withdrawn.clone(),
        waived: c.waived,
        promoted_before: c.promoted_before.clone(),
    }
}

/// A row as a [`Command`]; `None` for an environment name that is not one.
fn command_of(r: CommandRow) -> Option<(EnvName, Command)> {
    let env = r.environment.parse().ok()?;
    let c = Command {
        clock: r.clock,
        origin: r.origin,
        halt: r.halt.map(|(at, reason)| Halt {
            at: Stamp(at),
            reason,
        }),
        promoted: r.promoted,
        withdrawn: r.withdrawn,
        waived: r.waived,
        promoted_before: r.promoted_before,
    };
    Some((env, c))
}

/// The state in `store`, after importing `dir/rollout.json` if one is
/// there (its origin kept as this master's if the store had none).
pub(super) fn load(store: &StateStore, dir: &Path) -> Result<Persisted, StoreError> {
    import(store, dir)?;
    let mut p = Persisted {
        origin: store.origin()?,
        environments: store
            .commands()?
            .into_iter()
            .filter_map(command_of)
            .collect(),
        seen: BTreeMap::new(),
    };
    for (env, id) in store.seen()? {
        if let Ok(env) = env.parse() {
            p.seen.entry(env).or_default().push(id);
        }
    }
    Ok(p)
}

/// Every environment's commands' state as `store` holds it now.
pub(super) fn commands(store: &StateStore) -> Result<BTreeMap<EnvName, Command>, StoreError> {
    Ok(store
        .commands()?
        .into_iter()
        .filter_map(command_of)
        .collect())
}

/// Imports `dir/rollout.json` (environments the store does not hold yet)
/// and renames it; a file that does not parse is left where it is, logged.
fn import(store: &StateStore, dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(STATE_FILE);
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(());
    };
    let old: Persisted = match serde_json::from_slice(&bytes) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "rollout state not imported: it does not parse");
            return Ok(());
        }
    };
    let have: Vec<String> = store
        .commands()?
        .into_iter()
        .map(|r| r.environment)
        .collect();
    let rows: Vec<CommandRow> = (old.environments.iter())
        .filter(|(env, _)| !have.contains(&env.to_string()))
        .map(|(env, c)| row_of(env, c))
        .collect();
    store.write_commands(&rows, "import", STATE_FILE)?;
    for (env, ids) in &old.seen {
        store.add_seen(env.as_str(), ids, super::MAX_SEEN)?;
    }
    if store.meta(ORIGIN_KEY)?.is_none() && !old.origin.is_empty() {
        store.set_meta(ORIGIN_KEY, &old.origin)?;
    }
    match std::fs::rename(&path, dir.join(IMPORTED)) {
        Ok(()) => {
            tracing::warn!(path = %path.display(), environments = rows.len(), "rollout state imported into the state store; the file is renamed {IMPORTED}");
        }
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "rollout state imported but the file not renamed");
        }
    }
    Ok(())
}

/// Whether the state store answers, and so the time waves open at
/// (docs/rollouts.md#replicas): now while it answers;
/// while it does not, the moment the first read failed. Placement asked
/// before that moment used an earlier time, so freezing there moves no
/// node back (frozen at the last answer instead, a generation published
/// between that answer and the failure would close again for the nodes
/// it had reached).
#[derive(Debug, Default)]
pub(super) struct StoreClock {
    /// The first failed read since the store last answered.
    away_since: Option<Stamp>,
}

impl StoreClock {
    /// The store answered; whether it had been away.
    fn answered(&mut self) -> bool {
        self.away_since.take().is_some()
    }

    /// A read failed at `now`; whether the store was answering until now.
    fn failed(&mut self, now: Stamp) -> bool {
        let first = self.away_since.is_none();
        self.away_since.get_or_insert(now);
        first
    }

    /// The time waves are open at, `now` being now.
    fn as_of(&self, now: Stamp) -> Stamp {
        self.away_since.unwrap_or(now)
    }
}

impl super::Rollouts {
    /// Reads the commands' state again from the store when replicas share
    /// it (a command issued to another replica takes effect here within
    /// the server's next second, docs/rollouts.md#replicas), and records
    /// whether the store answers ([`Rollouts::as_of`]).
    pub fn refresh(&self) -> Result<(), StoreError> {
        let fresh = commands(&self.store);
        let mut clock = lock(&self.store_clock);
        match fresh {
            Ok(envs) => {
                if clock.answered() {
                    tracing::warn!(place = %self.store.place(), "state store answers again: waves open again");
                }
                if self.store.shared() {
                    lock(&self.state).environments = envs;
                }
                Ok(())
            }
            Err(e) => {
                if clock.failed(Stamp::now()) {
                    tracing::error!(error = %e, "state store away: no wave opens and no command is taken until it answers");
                }
                Err(e)
            }
        }
    }

    /// The time waves are open at: now, or, while the state store does not
    /// answer, when a read first failed (nothing widens without the
    /// database and no node moves back, docs/operating.md#the-state-store).
    pub fn as_of(&self) -> Stamp {
        lock(&self.store_clock).as_of(Stamp::now())
    }

    /// Why the state store is degraded, if it is: since when it has not
    /// answered.
    pub fn degraded(&self) -> Option<String> {
        lock(&self.store_clock).away_since.map(|at| {
            format!(
                "state store {} not answering since {}",
                self.store.place(),
                at
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generation published after the store's last answer and before
    /// the failed read keeps the share it had: the time waves open at
    /// never goes back, and stays put while the store is away.
    #[test]
    fn waves_freeze_at_the_first_failed_read_and_never_go_back() {
        let mut clock = StoreClock::default();
        assert_eq!(clock.as_of(Stamp(100)), Stamp(100));
        assert!(!clock.answered());
        // Answered at 100; a generation published at 101 opens its first
        // wave for placement asked at 101; the next read fails at 102.
        assert!(clock.failed(Stamp(102)));
        assert!(
            !clock.failed(Stamp(103)),
            "one error line, not one a second"
        );
        for now in [102, 103, 160] {
            assert_eq!(clock.as_of(Stamp(now)), Stamp(102));
        }
        assert!(clock.answered());
        assert_eq!(clock.as_of(Stamp(170)), Stamp(170));
    }
}
