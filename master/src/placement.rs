//! Placement (docs/rollouts.md#placement): which generation of an
//! environment, and which index, a node is served. The one owner of that
//! answer, for the per-node answer (`handlers/generations.rs`) and the v3
//! file endpoints (`handlers/files.rs`) alike.
//!
//! A request's [`Node`] (its certname, the generation it reports, whether
//! it is a stock Puppet agent) is read once, where the router sets the
//! request's identity (`routes.rs`). [`place`] gathers what the decision
//! needs (the kept generations, the rollout's state and policy, the run's
//! pin) into [`Facts`]; [`decide`] answers from them alone, without a
//! clock or a lock, as `rollout::pick` does for the waves; [`index`] then
//! finds the index of the generation decided (at hand, a stock run's
//! previous one, or made back from the generation store).
//!
//! - Without a `[[rollout]]` policy every node gets the index the
//!   environment serves now, and the per-node answer names its generation;
//!   a stock agent's run stays on the generation its first request saw
//!   (`store/pins.rs`, docs/protocol.md §7.6).
//! - With one, the node gets the generation the rollout's waves have
//!   reached (`rollout::pick`), a stock agent's run the one its first
//!   request was placed on (docs/rollouts.md#stock-puppet-agents), and a
//!   node reporting a generation this replica never kept is sent to
//!   another master (docs/rollouts.md#a-replica-that-lacks-a-generation).

use std::sync::Arc;

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::rollout::{NodeReport, ReportError, position};

use crate::generations::{Kept, Stamp};
use crate::index::EnvIndex;
use crate::rollout::{Command, Policy, Rollouts, pick};
use crate::store::Store;

/// The `User-Agent` prefix of a stock Puppet agent.
const STOCK_AGENT: &str = "Puppet/";

/// The node a request comes from, read once from the request by the
/// router (`routes.rs`) and handed to the handlers in its extensions.
#[derive(Debug, Clone, Default)]
pub struct Node {
    /// The request's certname (`None`: no identity).
    pub certname: Option<String>,
    /// Its `X-Pluginsync-Report` header, read (`None`: none sent).
    pub report: Option<Result<NodeReport, ReportError>>,
    /// A stock Puppet agent (its `User-Agent` starts with `Puppet/`): the
    /// only clients whose run is kept on one generation (pluginsync's
    /// agent asks for generations itself).
    pub stock: bool,
}

impl Node {
    /// The node of a request whose identity gives `certname`, sent with
    /// `user_agent` and the report header `report`.
    pub fn new(certname: Option<&str>, user_agent: Option<&[u8]>, report: Option<&[u8]>) -> Node {
        let report = report.map(|raw| {
            std::str::from_utf8(raw)
                .map_err(|e| ReportError::Malformed(e.to_string()))
                .and_then(NodeReport::from_header)
        });
        Node {
            certname: certname.map(str::to_owned),
            report,
            stock: user_agent.is_some_and(|ua| ua.starts_with(STOCK_AGENT.as_bytes())),
        }
    }

    /// The generation the node reports having.
    pub fn reported(&self) -> Option<GenerationId> {
        self.report.as_ref()?.as_ref().ok()?.generation
    }

    /// A stock agent's certname: the run a pin holds.
    pub fn stock_certname(&self) -> Option<&str> {
        self.certname.as_deref().filter(|_| self.stock)
    }
}

/// What a node is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// This kept generation, from its index.
    Serve(Kept),
    /// A stock agent's run stays on generation `pinned`, the one its first
    /// request was placed on; `chosen` is the rollout's choice now,
    /// answered instead when `pinned` can no longer be (`None` without a
    /// policy: the current index).
    Pinned {
        /// The generation the run is held on.
        pinned: GenerationId,
        /// What the node would be served otherwise.
        chosen: Option<GenerationId>,
    },
    /// The node has a generation this replica never kept: another master
    /// must answer.
    Elsewhere(GenerationId),
    /// Nothing placed yet: the index the environment serves now.
    Current,
}

/// Everything [`decide`] looks at, read before it is asked.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The environment's kept generations, newest first (none read for
    /// a v3 request without a policy: see [`place`]).
    pub kept: &'a [Kept],
    /// The rollout's commands' state.
    pub command: &'a Command,
    /// The environment's `[[rollout]]` policy, if any.
    pub policy: Option<&'a Policy>,
    /// The node's position in the environment's waves.
    pub position: f64,
    /// Now.
    pub now: Stamp,
    /// The generation of the index the environment serves now.
    pub current: Option<GenerationId>,
    /// The generation the node reports having.
    pub reported: Option<GenerationId>,
    /// A node reporting a generation not kept here is sent to another
    /// master ([`Rollouts::sends_elsewhere`]).
    pub elsewhere: bool,
    /// The generation a stock agent's run is pinned to, within the window
    /// (`None` for the request that starts a run).
    pub pin: Option<GenerationId>,
}

/// What `facts` place the node on. See the module docs.
pub fn decide(facts: &Facts) -> Placement {
    let Some(policy) = facts.policy else {
        let Some(current) = facts.current else {
            return Placement::Current;
        };
        if let Some(pinned) = facts.pin.filter(|p| *p != current) {
            return Placement::Pinned {
                pinned,
                chosen: None,
            };
        }
        return facts
            .kept
            .iter()
            .find(|k| k.id == current)
            .map_or(Placement::Current, |k| Placement::Serve(k.clone()));
    };
    if let Some(r) = facts.reported
        && facts.elsewhere
        && !facts.kept.is_empty()
        && !facts.kept.iter().any(|k| k.id == r)
    {
        return Placement::Elsewhere(r);
    }
    let Some(chosen) = pick(
        facts.kept,
        facts.command,
        Some(policy),
        facts.position,
        facts.now,
    ) else {
        return Placement::Current;
    };
    match facts.pin.filter(|p| *p != chosen.id) {
        Some(pinned) => Placement::Pinned {
            pinned,
            chosen: Some(chosen.id),
        },
        None => Placement::Serve(chosen.clone()),
    }
}

/// What a request asks placement for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asking {
    /// The per-node answer: a stock run's pin does not apply.
    Assignment,
    /// A v3 file request; `starts_run` for a run's first one (Puppet
    /// searches the `pluginfacts` mount first), which pins a stock
    /// agent's run to what it is placed on.
    Files {
        /// The request starts a run.
        starts_run: bool,
    },
}

/// Where `node` is placed in `env`, whose index now is of generation
/// `current`; a stock agent's run starting now is pinned to it. Without a
/// policy a v3 request needs nothing but the current index (and a stock
/// run's pin): the kept generations and the rollout's state are not read,
/// so a listing costs what it did before rollouts.
pub fn place(
    store: &Store,
    rollouts: &Rollouts,
    env: &EnvName,
    node: &Node,
    current: Option<GenerationId>,
    asking: Asking,
) -> Placement {
    let policy = rollouts.policy(env);
    let kept = match (policy, asking) {
        (None, Asking::Files { .. }) => Vec::new(),
        _ => store.generations.kept(env),
    };
    let command = match policy {
        Some(_) => rollouts.command(env),
        None => Command::default(),
    };
    let reported = node.reported();
    let stock = match asking {
        Asking::Files { starts_run } => node.stock_certname().map(|c| (c, starts_run)),
        Asking::Assignment => None,
    };
    let pin = match stock {
        Some((certname, false)) => store.run_pin(env, certname),
        _ => None,
    };
    let facts = Facts {
        kept: &kept,
        command: &command,
        policy,
        position: policy.map_or(0.0, |_| {
            position(env.as_str(), node.certname.as_deref().unwrap_or_default())
        }),
        now: rollouts.as_of(),
        current,
        reported,
        elsewhere: reported.is_some_and(|r| rollouts.sends_elsewhere(env, &r)),
        pin,
    };
    let placed = decide(&facts);
    if let Some((certname, true)) = stock {
        let on = match &placed {
            Placement::Serve(k) => Some(k.id),
            _ => current,
        };
        if let Some(generation) = on {
            store.pin_run(env, certname, generation);
        }
    }
    placed
}

/// This master cannot answer from the generation a node is placed on.
#[derive(Debug, thiserror::Error)]
pub enum Unplaced {
    /// The node has generation `id`, which this replica never kept.
    #[error("this master does not hold generation {} of '{env}'; ask another master", id.short())]
    Elsewhere {
        /// The generation.
        id: GenerationId,
        /// Of this environment.
        env: EnvName,
    },
    /// Generation `id`'s index is not in the store (or does not read back).
    #[error("this master cannot serve generation {} of '{env}'; ask another master", id.short())]
    NotHere {
        /// The generation.
        id: GenerationId,
        /// Of this environment.
        env: EnvName,
    },
}

/// The index a node placed by `placed` is answered from, `current` being
/// the environment's index now: made back from the generation store off
/// the connection's thread when not at hand.
pub async fn index(
    store: &Arc<Store>,
    env: &EnvName,
    current: Arc<EnvIndex>,
    placed: &Placement,
) -> Result<Arc<EnvIndex>, Unplaced> {
    let (id, chosen) = match placed {
        Placement::Current => return Ok(current),
        Placement::Elsewhere(id) => {
            return Err(Unplaced::Elsewhere {
                id: *id,
                env: env.clone(),
            });
        }
        Placement::Pinned {
            pinned,
            chosen: None,
        } => return Ok(store.previous_index(env, *pinned).unwrap_or(current)),
        Placement::Pinned {
            pinned,
            chosen: Some(c),
        } => (*pinned, *c),
        Placement::Serve(k) => (k.id, k.id),
    };
    if let Some(idx) = store.placed_at_hand(env, &current, id) {
        return Ok(idx);
    }
    let (s, name) = (store.clone(), env.clone());
    tokio::task::spawn_blocking(move || s.placed_index(&name, &current, id, chosen))
        .await
        .map_err(|_| Unplaced::NotHere {
            id,
            env: env.clone(),
        })?
        .map_err(|e| {
            if store.placed_failed(env, id) {
                tracing::error!(env = %env, generation = %id.short(), error = %e, "cannot answer from the generation a rollout placed the client on");
            }
            Unplaced::NotHere {
            id,
            env: env.clone(),
        }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::tests::{POLICY, kept, rules};
    use crate::rollout::{Halt, Policies};

    /// The facts of a node at position `p`, reporting nothing, unpinned.
    fn facts<'a>(
        kept: &'a [Kept],
        command: &'a Command,
        policy: Option<&'a Policy>,
        p: f64,
    ) -> Facts<'a> {
        Facts {
            kept,
            command,
            policy,
            position: p,
            now: Stamp(2000),
            current: kept.first().map(|k| k.id),
            reported: None,
            elsewhere: false,
            pin: None,
        }
    }

    #[test]
    fn decisions() {
        let ps = Policies::new(&rules(POLICY)).unwrap();
        let policy = ps.of("production");
        let (old, new) = (kept("old", 1000), kept("new", 2000));
        let list = vec![new.clone(), old.clone()];
        let cmd = Command::default();
        // No policy: the current index's generation, whatever the position.
        let f = facts(&list, &cmd, None, 0.99);
        assert_eq!(decide(&f), Placement::Serve(new.clone()));
        let f = Facts { current: None, ..f };
        assert_eq!(decide(&f), Placement::Current, "no generation yet");
        let f = Facts {
            current: Some(kept("unkept", 3000).id),
            ..f
        };
        assert_eq!(decide(&f), Placement::Current, "current not kept");
        // A policy, no kept generation: nothing yet.
        let f = facts(&[], &cmd, policy, 0.5);
        assert_eq!(decide(&f), Placement::Current);
        // A policy: the first wave (10 %) has the new one, the rest the old.
        let f = facts(&list, &cmd, policy, 0.99);
        assert_eq!(decide(&f), Placement::Serve(old.clone()));
        let early = (0..1000)
            .map(|i| position("production", &format!("node{i}")))
            .find(|p| pluginsync_common::rollout::in_share(*p, 10.0))
            .unwrap();
        assert_eq!(
            decide(&facts(&list, &cmd, policy, early)),
            Placement::Serve(new.clone())
        );
        // A stock agent's run pinned to the old one stays there.
        let pinned = Facts {
            pin: Some(old.id),
            ..facts(&list, &cmd, policy, early)
        };
        let want = Placement::Pinned {
            pinned: old.id,
            chosen: Some(new.id),
        };
        assert_eq!(decide(&pinned), want);
        let same = Facts {
            pin: Some(old.id),
            ..facts(&list, &cmd, policy, 0.99)
        };
        assert_eq!(decide(&same), Placement::Serve(old.clone()));
        let no_policy = Facts {
            pin: Some(old.id),
            ..facts(&list, &cmd, None, 0.5)
        };
        let want = Placement::Pinned {
            pinned: old.id,
            chosen: None,
        };
        assert_eq!(decide(&no_policy), want);
        // A node reporting a generation this replica never kept.
        let gone = kept("gone", 500).id;
        let asks = Facts {
            reported: Some(gone),
            elsewhere: true,
            ..facts(&list, &cmd, policy, 0.5)
        };
        assert_eq!(decide(&asks), Placement::Elsewhere(gone));
        let lone = Facts {
            elsewhere: false,
            ..asks.clone()
        };
        assert!(
            matches!(decide(&lone), Placement::Serve(_)),
            "a lone master"
        );
        let known = Facts {
            reported: Some(old.id),
            ..asks
        };
        assert!(matches!(decide(&known), Placement::Serve(_)), "kept here");
        // Halted before the new one was published: nobody gets it.
        let halted = Command {
            halt: Some(Halt {
                at: Stamp(1500),
                reason: "test".into(),
            }),
            ..Command::default()
        };
        assert_eq!(
            decide(&facts(&list, &halted, policy, early)),
            Placement::Serve(old)
        );
    }
}
