//! Rollouts (docs/rollouts.md): which kept generation each node is served
//! when an environment has a `[[rollout]]` policy, the health gate that
//! halts one, and the operator's commands (halt, resume, promote,
//! rollback), kept in the state store (`statestore/`).
//!
//! **Placement.** A node at position `p` (`pluginsync_common::rollout::position`
//! of the environment and its certname) is served the newest kept,
//! not withdrawn generation that has reached it: the oldest such
//! generation reaches everyone (the first a master publishes), a promoted
//! one (now or before a newer promotion) reaches everyone, and any other reaches the nodes inside the share
//! its timed waves have opened since its publication. While halted, the
//! shares are those open at the halt: no node moves. Without a policy the
//! newest not-withdrawn generation is everyone's (today's behaviour).
//! A rollback only withdraws: each node falls back to the newest that
//! reached it, the one it had.
//!
//! **State.** The commands' state per environment ([`Command`]) counts
//! its commands (`clock`, one more per command, never wrapping). Each
//! command (and each automatic halt) is one transaction of the state
//! store, with its history row, before it takes effect here; a halt's
//! time is the database's; replicas sharing one read it back
//! (`persist.rs`) and adopt nothing from each other
//! (docs/rollouts.md#replicas).
//!
//! | file | answers |
//! |---|---|
//! | `mod.rs` | [`Rollouts`]: placement and the gate. |
//! | `commands.rs` | Halt, resume, promote, rollback: applied and kept. |
//! | `persist.rs` | The state in the store; `rollout.json` imported once. |
//! | `policy.rs` | `[[rollout]]`: parsed, checked, compiled. |
//! | `api.rs` | The admin API calls and `pluginsync-master rollout`. |

pub mod api;
mod commands;
mod persist;
mod policy;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::mutex::lock;
use pluginsync_common::rollout::in_share;
use serde::{Deserialize, Serialize};

use self::persist::{Persisted, StoreClock};
use crate::generations::{Generations, Kept, Stamp};
use crate::statestore::{StateStore, StoreError};

#[cfg(test)]
use self::commands::named_in;
pub use self::commands::{Action, RolloutError};
pub use self::policy::{HaltOn, Policies, Policy, RolloutRule, WaveSpec};

/// Generations remembered per environment as seen by this replica (and
/// withdrawn ones kept at most).
const MAX_SEEN: usize = 256;

/// How many nodes are on a generation and how many of them report
/// failing loads, over the whole fleet (on a shared store, every
/// replica's). The server hands one to [`Rollouts::set_fleet`].
pub trait FleetCounts: Send + Sync {
    /// `(nodes, failing_nodes)` on `generation` of `env`.
    fn on_generation(&self, env: &EnvName, generation: &GenerationId) -> (u64, u64);
}

/// One environment's rollout commands, as persisted (written as
/// [`CommandRecord`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "CommandRecord", into = "CommandRecord")]
pub struct Command {
    /// How many commands (and automatic halts) were applied: one more
    /// per command, saturating, never wrapping.
    pub clock: u64,
    /// The replica that applied the last one.
    pub origin: String,
    /// Halted: no node moves.
    pub halt: Option<Halt>,
    /// The generation everyone is served (promote).
    pub promoted: Option<GenerationId>,
    /// Generations promoted before `promoted` (oldest first): they reached
    /// everyone too, so withdrawing a newer one returns the fleet to them.
    pub promoted_before: Vec<GenerationId>,
    /// Generations rolled back: never served again until promoted.
    pub withdrawn: Vec<GenerationId>,
    /// A generation the operator resumed: the gate no longer halts on it.
    pub waived: Option<GenerationId>,
}

/// A halt: when it came (shares are frozen there) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    /// When.
    pub at: Stamp,
    /// Why (the gate's reason, or `halted by <certname>`).
    pub reason: String,
}

impl Command {
    /// Whether `id` reaches everyone: promoted now or before (and not
    /// withdrawn since, which placement checks first).
    pub fn reaches_everyone(&self, id: &GenerationId) -> bool {
        self.promoted.as_ref() == Some(id) || self.promoted_before.contains(id)
    }
}

/// [`Command`] as `rollout.json` held it: the halt as three fields
/// (`halted`, `halted_at` in unix seconds, `reason`), so files from
/// before [`Halt`] still read.
#[derive(Serialize, Deserialize)]
struct CommandRecord {
    clock: u64,
    origin: String,
    halted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    halted_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    promoted: Option<GenerationId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    promoted_before: Vec<GenerationId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    withdrawn: Vec<GenerationId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    waived: Option<GenerationId>,
}

impl From<CommandRecord> for Command {
    /// A halt written without its time (never by this master) is taken as
    /// one that came when it is read.
    fn from(r: CommandRecord) -> Command {
        let halt = r.halted.then(|| Halt {
            at: r.halted_at.map_or_else(Stamp::now, Stamp),
            reason: r.reason.unwrap_or_default(),
        });
        Command {
            clock: r.clock,
            origin: r.origin,
            halt,
            promoted: r.promoted,
            promoted_before: r.promoted_before,
            withdrawn: r.withdrawn,
            waived: r.waived,
        }
    }
}

impl From<Command> for CommandRecord {
    fn from(c: Command) -> CommandRecord {
        CommandRecord {
            clock: c.clock,
            origin: c.origin,
            halted: c.halt.is_some(),
            halted_at: c.halt.as_ref().map(|h| h.at.0),
            reason: c.halt.map(|h| h.reason),
            promoted: c.promoted,
            promoted_before: c.promoted_before,
            withdrawn: c.withdrawn,
            waived: c.waived,
        }
    }
}

/// The rollout policies, the commands' state and the fleet's counts.
/// See the module docs.
pub struct Rollouts {
    policies: Policies,
    store: Arc<StateStore>,
    state: Mutex<Persisted>,
    fleet: OnceLock<Arc<dyn FleetCounts>>,
    /// Whether the state store answers ([`Rollouts::refresh`]) and the
    /// time waves open at.
    store_clock: Mutex<StoreClock>,
}

impl std::fmt::Debug for Rollouts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rollouts")
            .field("store", &self.store.place())
            .finish_non_exhaustive()
    }
}

impl Rollouts {
    /// The rollouts of `rules` (already checked by the config), their state
    /// in the embedded store under `dir` (the generation store's
    /// directory); one that cannot be opened is logged, and the state kept
    /// in memory only.
    pub fn new(rules: &[RolloutRule], dir: &std::path::Path) -> Rollouts {
        let opened = StateStore::open(&crate::statestore::Settings::embedded(dir))
            .map(Arc::new)
            .and_then(|store| Rollouts::with_store(rules, store, dir));
        opened.unwrap_or_else(|e| {
            tracing::error!(error = %e, "rollout state kept in memory only");
            Rollouts {
                policies: Policies::new(rules).unwrap_or_default(),
                store: Arc::new(StateStore::in_memory()),
                state: Mutex::default(),
                fleet: OnceLock::new(),
                store_clock: Mutex::default(),
            }
        })
    }

    /// The rollouts of `rules`, their state read from `store` (a
    /// `rollout.json` in `dir`, the generation store's directory, imported
    /// first: [`persist`]).
    pub fn with_store(
        rules: &[RolloutRule],
        store: Arc<StateStore>,
        dir: &std::path::Path,
    ) -> Result<Rollouts, StoreError> {
        let persisted = persist::load(&store, dir)?;
        Ok(Rollouts {
            policies: Policies::new(rules).unwrap_or_default(),
            store,
            state: Mutex::new(persisted),
            fleet: OnceLock::new(),
            store_clock: Mutex::default(),
        })
    }

    /// Now, as the state store's clock says (this host's if it cannot).
    fn now(&self) -> Stamp {
        self.store.now().map_or_else(|_| Stamp::now(), Stamp)
    }

    /// Hands the fleet's counts to the health gate (once).
    pub fn set_fleet(&self, fleet: Arc<dyn FleetCounts>) {
        let _ = self.fleet.set(fleet);
    }

    /// The policy of `env`, if any.
    pub fn policy(&self, env: &EnvName) -> Option<&Policy> {
        self.policies.of(env.as_str())
    }

    /// `env`'s commands' state.
    pub fn command(&self, env: &EnvName) -> Command {
        lock(&self.state)
            .environments
            .get(env)
            .cloned()
            .unwrap_or_default()
    }

    /// Whether a node reporting generation `id` of `env`, which this
    /// replica never kept, is sent to another master: the state store is
    /// shared (so other replicas serve this fleet) and `id` is not among
    /// the generations this replica has seen
    /// (docs/rollouts.md#a-replica-that-lacks-a-generation).
    pub fn sends_elsewhere(&self, env: &EnvName, id: &GenerationId) -> bool {
        self.store.shared()
            && !lock(&self.state)
                .seen
                .get(env)
                .is_some_and(|s| s.contains(id))
    }

    /// Records the generations `gens` keeps as seen (a restarted replica
    /// whose store was lost then knows what it never held), runs the
    /// health gate of every environment with a policy, and returns the
    /// environments it halted now. Called every second by the server.
    pub fn tick(&self, gens: &Generations) -> Vec<EnvName> {
        let mut halted = Vec::new();
        for (env, _) in gens.counts() {
            let kept = gens.kept(&env);
            self.see(&env, &kept);
            if let Some(reason) = self.gate(&env, &kept) {
                tracing::error!(env = %env, "rollout halted: {reason}");
                let at = self.now();
                let next = self.next(&env, |c| c.halt = Some(Halt { at, reason }));
                match self.commit(&env, next, "halt", "the gate") {
                    Ok(()) => halted.push(env.clone()),
                    Err(e) => tracing::error!(error = %e, "rollout halt not written"),
                }
            }
        }
        halted
    }

    /// Records `kept` (newest first) among `env`'s seen generations, in
    /// the store when one is new.
    fn see(&self, env: &EnvName, kept: &[Kept]) {
        let new: Vec<GenerationId> = {
            let mut st = lock(&self.state);
            let seen = st.seen.entry(env.clone()).or_default();
            let new: Vec<GenerationId> = (kept.iter().rev())
                .map(|k| k.id)
                .filter(|id| !seen.contains(id))
                .collect();
            seen.extend(&new);
            let over = seen.len().saturating_sub(MAX_SEEN);
            seen.drain(..over);
            new
        };
        if !new.is_empty()
            && let Err(e) = self.store.add_seen(env.as_str(), &new, MAX_SEEN)
        {
            tracing::error!(error = %e, "seen generations not written");
        }
    }

    /// Why `env`'s rollout must halt now, if the gate trips: the newest
    /// generation being rolled out (not the only one, not promoted, not
    /// waived) has too many failing nodes.
    fn gate(&self, env: &EnvName, kept: &[Kept]) -> Option<String> {
        let gate = self.policies.of(env.as_str())?.halt_on?;
        let fleet = self.fleet.get()?;
        let cmd = self.command(env);
        if cmd.halt.is_some() {
            return None;
        }
        let mut serving = kept.iter().filter(|k| !cmd.withdrawn.contains(&k.id));
        let newest = serving.next()?;
        serving.next()?;
        if cmd.reaches_everyone(&newest.id) || cmd.waived == Some(newest.id) {
            return None;
        }
        let (nodes, failing) = fleet.on_generation(env, &newest.id);
        gate.trips(nodes, failing).then(|| {
            format!(
                "{failing} of {nodes} nodes on generation {} report load failures \
                 (halt_on_load_failures: {} percent, {} nodes)",
                newest.id.short(),
                gate.percent,
                gate.min_nodes
            )
        })
    }
}

/// The generation of `kept` (newest first) served at position `p` at
/// `now`: the newest not withdrawn that reached `p` (module docs); the
/// newest kept if every one is withdrawn. Pure: placement (`placement.rs`)
/// asks it.
pub fn pick<'a>(
    kept: &'a [Kept],
    cmd: &Command,
    policy: Option<&Policy>,
    p: f64,
    now: Stamp,
) -> Option<&'a Kept> {
    let candidates: Vec<&Kept> = kept
        .iter()
        .filter(|k| !cmd.withdrawn.contains(&k.id))
        .collect();
    let newest = candidates.first().copied().or(kept.first())?;
    let Some(policy) = policy else {
        return Some(newest);
    };
    let as_of = cmd.halt.as_ref().map_or(now, |h| h.at);
    let last = candidates.len().saturating_sub(1);
    let reached = candidates.iter().enumerate().find(|(i, k)| {
        *i == last
            || cmd.reaches_everyone(&k.id)
            || in_share(p, policy.open_percent(elapsed(k, as_of)))
    });
    Some(reached.map_or(newest, |(_, k)| *k))
}

/// Time from `k`'s publication to `as_of`; `None` before it.
fn elapsed(k: &Kept, as_of: Stamp) -> Option<Duration> {
    as_of.since(k.published)
}

/// The share `k` has opened now under `policy`, and its timed waves
/// open, for status.
pub fn status_of(policy: Option<&Policy>, cmd: &Command, k: &Kept) -> (f64, usize) {
    let Some(policy) = policy else {
        return (100.0, 0);
    };
    let as_of = cmd.halt.as_ref().map_or_else(Stamp::now, |h| h.at);
    let e = elapsed(k, as_of);
    (policy.open_percent(e), policy.waves_open(e))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pluginsync_common::digest::Sha256;
    use pluginsync_common::rollout::position;

    pub(crate) fn kept(name: &str, published: i64) -> Kept {
        Kept {
            id: GenerationId(Sha256::of(name.as_bytes())),
            published: Stamp(published),
            files: 1,
            bytes: 1,
            label: None,
        }
    }

    pub(crate) fn rules(text: &str) -> Vec<RolloutRule> {
        #[derive(Deserialize)]
        struct Doc {
            rollout: Vec<RolloutRule>,
        }
        toml::from_str::<Doc>(text).unwrap().rollout
    }

    pub(crate) const POLICY: &str = "[[rollout]]\nenvironments = [\"production\"]\n\
        waves = [ { after = \"0s\", percent = 10 }, { after = \"60s\", percent = 50 }, { after = \"120s\", percent = 100 } ]\n\
        halt_on_load_failures = { percent = 20, min_nodes = 2 }\n";

    /// Positions of 1000 nodes, and the share served `id` by `pick`.
    fn share(
        list: &[Kept],
        cmd: &Command,
        policy: Option<&Policy>,
        now: i64,
        id: GenerationId,
    ) -> f64 {
        let n = 1000;
        let on = (0..n)
            .filter(|i| {
                let p = position("production", &format!("node{i}"));
                pick(list, cmd, policy, p, Stamp(now)).unwrap().id == id
            })
            .count();
        on as f64 / n as f64
    }

    #[test]
    fn waves_open_with_time_and_a_halt_freezes_them() {
        let ps = Policies::new(&rules(POLICY)).unwrap();
        let policy = ps.of("production");
        let (old, new) = (kept("old", 1000), kept("new", 2000));
        let list = vec![new.clone(), old.clone()];
        let mut cmd = Command::default();
        assert_eq!(share(&list, &cmd, policy, 1999, new.id), 0.0);
        let first = share(&list, &cmd, policy, 2000, new.id);
        assert!((0.06..0.14).contains(&first), "{first}");
        let second = share(&list, &cmd, policy, 2060, new.id);
        assert!((0.44..0.56).contains(&second), "{second}");
        assert_eq!(share(&list, &cmd, policy, 2120, new.id), 1.0);
        assert_eq!(
            share(&list, &cmd, None, 2000, new.id),
            1.0,
            "no policy: everyone"
        );
        assert_eq!(
            share(std::slice::from_ref(&old), &cmd, policy, 0, old.id),
            1.0,
            "the first reaches everyone"
        );
        cmd.halt = Some(Halt {
            at: Stamp(2030),
            reason: "test".into(),
        });
        assert_eq!(
            share(&list, &cmd, policy, 9999, new.id),
            first,
            "halted: no node moves"
        );
        cmd.promoted = Some(new.id);
        assert_eq!(
            share(&list, &cmd, policy, 2000, new.id),
            1.0,
            "promoted: everyone"
        );
    }

    #[test]
    fn overlapping_rollouts_keep_the_newest_that_reached_a_node() {
        let ps = Policies::new(&rules(POLICY)).unwrap();
        let policy = ps.of("production");
        let list = vec![kept("c", 2060), kept("b", 2000), kept("a", 1000)];
        let cmd = Command::default();
        for i in 0..500 {
            let p = position("production", &format!("node{i}"));
            let got = pick(&list, &cmd, policy, p, Stamp(2060)).unwrap();
            let want = if in_share(p, 10.0) {
                &list[0]
            } else if in_share(p, 50.0) {
                &list[1]
            } else {
                &list[2]
            };
            assert_eq!(got.id, want.id, "node{i} at {p}");
        }
    }

    struct Counts(u64, u64);
    impl FleetCounts for Counts {
        fn on_generation(&self, _: &EnvName, _: &GenerationId) -> (u64, u64) {
            (self.0, self.1)
        }
    }

    #[test]
    fn the_gate_halts_once_and_commands_persist() {
        let dir = tempfile::tempdir().unwrap();
        let r = Rollouts::new(&rules(POLICY), dir.path());
        let env: EnvName = "production".parse().unwrap();
        let list = vec![kept("new", 2000), kept("old", 1000)];
        assert_eq!(r.gate(&env, &list), None, "no fleet, no gate");
        r.set_fleet(Arc::new(Counts(10, 2)));
        let reason = r
            .gate(&env, &list)
            .expect("2 of 10 trips 20 percent, 2 nodes");
        assert!(reason.contains("2 of 10 nodes"), "{reason}");
        assert_eq!(
            r.gate(&env, &list[1..]),
            None,
            "the only generation never halts"
        );
        r.apply_to(&list, &env, Action::Halt, "op").unwrap();
        assert_eq!(r.gate(&env, &list), None, "already halted");
        r.apply_to(&list, &env, Action::Resume, "op").unwrap();
        assert_eq!(
            r.gate(&env, &list),
            None,
            "resumed: waived for that generation"
        );
        // A rollback withdraws, and promotes nothing (docs/rollouts.md#commands).
        let c = r
            .apply_to(&list, &env, Action::Rollback(None), "op")
            .unwrap();
        assert_eq!((c.withdrawn.clone(), c.promoted), (vec![list[0].id], None));
        assert!(matches!(
            r.apply_to(&list, &env, Action::Rollback(None), "op"),
            Err(RolloutError::NothingEarlier(_))
        ));
        let again = Rollouts::new(&rules(POLICY), dir.path());
        assert_eq!(again.command(&env), c, "a restart keeps the state");
        assert_eq!(
            pick(&list, &c, again.policy(&env), 0.0, Stamp(9999))
                .unwrap()
                .id,
            list[1].id
        );
        let c = again.apply_to(&list, &env, Action::Promote, "op").unwrap();
        assert!(c.withdrawn.is_empty() && c.promoted == Some(list[0].id));
        assert_eq!(c.clock, 4, "halt, resume, rollback, promote");
    }

    #[test]
    fn a_named_rollback_applies_once_and_refuses_any_but_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let r = Rollouts::new(&rules(POLICY), dir.path());
        let env: EnvName = "production".parse().unwrap();
        let (a, b, c) = (kept("a", 1000), kept("b", 2000), kept("c", 3000));
        let three = vec![c.clone(), b.clone(), a];
        let older = Action::Rollback(Some(b.id));
        assert!(
            matches!(
                r.apply_to(&three, &env, older, "op"),
                Err(RolloutError::NotNewest { .. })
            ),
            "b is served but c is the newest"
        );
        let named = Action::Rollback(Some(c.id));
        let once = r.apply_to(&three, &env, named, "op").unwrap();
        assert_eq!(once.withdrawn, vec![c.id]);
        // The same command again, as a retry or from a second replica.
        let twice = r.apply_to(&three, &env, named, "op").unwrap();
        assert_eq!(twice, once, "nothing changed, the clock included");
        assert_eq!(r.command(&env).withdrawn, vec![c.id], "b stays served");
        // Unnamed, a rollback withdraws the newest served, whichever it is.
        let unnamed = r
            .apply_to(&three, &env, Action::Rollback(None), "op")
            .unwrap();
        assert_eq!(unnamed.withdrawn, vec![c.id, b.id]);
        // Names: the whole id or a unique prefix of 12 or more hex digits.
        let hex = c.id.to_hex();
        assert_eq!(named_in(&three, &env, &hex).unwrap(), c.id);
        assert_eq!(named_in(&three, &env, &hex[..12]).unwrap(), c.id);
        for bad in [&hex[..11], "XYZ", &"0".repeat(64)] {
            let e = named_in(&three, &env, bad).unwrap_err().to_string();
            assert!(
                e.starts_with("environment 'production' keeps no generation"),
                "{e}"
            );
        }
    }

    /// Where each of 1000 nodes is placed (its generation's name in `names`).
    fn places(list: &[Kept], cmd: &Command, policy: Option<&Policy>) -> Vec<GenerationId> {
        (0..1000)
            .map(|i| {
                let p = position("production", &format!("node{i}"));
                pick(list, cmd, policy, p, Stamp(2030)).unwrap().id
            })
            .collect()
    }

    #[test]
    fn a_rollback_returns_the_nodes_that_took_it_and_moves_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let r = Rollouts::new(&rules(POLICY), dir.path());
        let env: EnvName = "production".parse().unwrap();
        let policy = r.policy(&env);
        // a everyone's, b in its first wave, c in its own (the same nodes).
        let (a, b, c) = (kept("a", 1000), kept("b", 2000), kept("c", 2010));
        let two = vec![b.clone(), a.clone()];
        let three = vec![c, b.clone(), a.clone()];
        let before = places(&two, &r.command(&env), policy);
        assert!(before.contains(&a.id) && before.contains(&b.id));
        let cmd = r
            .apply_to(&three, &env, Action::Rollback(None), "op")
            .unwrap();
        assert_eq!(cmd.promoted, None, "nothing promoted");
        assert_eq!(
            places(&three, &cmd, policy),
            before,
            "b's wave on b, the rest on a"
        );
        // Promoted twice, the newer rolled back: everyone on the older.
        let dir = tempfile::tempdir().unwrap();
        let r = Rollouts::new(&rules(POLICY), dir.path());
        r.apply_to(&two, &env, Action::Promote, "op").unwrap();
        r.apply_to(&three, &env, Action::Promote, "op").unwrap();
        let cmd = r
            .apply_to(&three, &env, Action::Rollback(None), "op")
            .unwrap();
        assert!(places(&three, &cmd, policy).iter().all(|g| *g == b.id));
        assert!(r.gate(&env, &three).is_none(), "b reached everyone");
    }

    #[test]
    fn a_rollout_json_is_imported_once_and_renamed() {
        let dir = tempfile::tempdir().unwrap();
        let env: EnvName = "production".parse().unwrap();
        let old = r#"{"origin":"abc","environments":{"production":
            {"clock":2,"origin":"a","halted":true,"halted_at":2030,"reason":"halted by op"}}}"#;
        std::fs::write(dir.path().join("rollout.json"), old).unwrap();
        let r = Rollouts::new(&rules(POLICY), dir.path());
        let halt = Halt {
            at: Stamp(2030),
            reason: "halted by op".into(),
        };
        assert_eq!(r.command(&env).halt, Some(halt.clone()));
        assert!(!dir.path().join("rollout.json").exists());
        assert!(dir.path().join("rollout.json.imported").exists());
        drop(r);
        let again = Rollouts::new(&rules(POLICY), dir.path());
        let c = again.command(&env);
        assert_eq!(
            (c.clock, c.halt),
            (2, Some(halt)),
            "kept, not imported twice"
        );
    }

    #[test]
    fn a_clock_at_its_end_takes_commands_without_wrapping() {
        let dir = tempfile::tempdir().unwrap();
        let env: EnvName = "production".parse().unwrap();
        let worn = format!(
            r#"{{"origin":"abc","environments":{{"production":
            {{"clock":{},"origin":"a","halted":true,"halted_at":2030,"reason":"x"}}}}}}"#,
            u64::MAX
        );
        std::fs::write(dir.path().join("rollout.json"), worn).unwrap();
        let r = Rollouts::new(&rules(POLICY), dir.path());
        assert_eq!(r.command(&env).clock, u64::MAX);
        let list = vec![kept("new", 2000), kept("old", 1000)];
        let c = r.apply_to(&list, &env, Action::Halt, "op").unwrap();
        assert_eq!(c.clock, u64::MAX, "not wrapped");
        assert_eq!(
            c.halt.unwrap().at,
            Stamp(2030),
            "a second halt keeps the first's time"
        );
        let c = r.apply_to(&list, &env, Action::Resume, "op").unwrap();
        assert_eq!((c.clock, c.halt), (u64::MAX, None), "resumed, not wrapped");
        let again = Rollouts::new(&rules(POLICY), dir.path());
        let kept_state = again.command(&env);
        assert_eq!(kept_state.halt, None, "the resume is what the store keeps");
        assert_eq!(kept_state.clock, u64::MAX);
    }

    #[test]
    fn a_halt_reads_and_writes_as_three_fields() {
        let old =
            r#"{"clock":2,"origin":"a","halted":true,"halted_at":2030,"reason":"halted by op"}"#;
        let c: Command = serde_json::from_str(old).unwrap();
        let halt = Halt {
            at: Stamp(2030),
            reason: "halted by op".into(),
        };
        assert_eq!(c.halt, Some(halt));
        assert_eq!(serde_json::to_string(&c).unwrap(), old);
        let rolling = r#"{"clock":3,"origin":"a","halted":false}"#;
        let c: Command = serde_json::from_str(rolling).unwrap();
        assert_eq!(c.halt, None);
        assert_eq!(serde_json::to_string(&c).unwrap(), rolling);
    }
}
