//! The operator's commands on a rollout (docs/rollouts.md#commands):
//! halt, resume, promote and rollback, parsed, applied to the state as the
//! store holds it now, and written as one transaction with their history
//! row before they take effect. A rollback may name the generation it
//! withdraws, which makes it idempotent.

use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::mutex::lock;

use super::{Command, Halt, MAX_SEEN, Rollouts, persist};
use crate::generations::{Generations, Kept};
use crate::statestore::StoreError;

/// [`Rollouts::named`] among `kept`.
pub(super) fn named_in(
    kept: &[Kept],
    env: &EnvName,
    text: &str,
) -> Result<GenerationId, RolloutError> {
    let unknown = |why| RolloutError::UnknownGeneration {
        env: env.to_string(),
        named: text.chars().take(64).collect(),
        why,
    };
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    if text.len() < 12 || text.len() > 64 || !text.chars().all(hex) {
        return Err(unknown(" (12 to 64 lowercase hex digits)"));
    }
    let mut found = kept.iter().filter(|k| k.id.to_hex().starts_with(text));
    match (found.next(), found.next()) {
        (Some(k), None) => Ok(k.id),
        (Some(_), Some(_)) => Err(unknown(" alone (several start so)")),
        (None, _) => Err(unknown("")),
    }
}

/// An operator's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Freeze every share: no node moves.
    Halt,
    /// Lift a halt; waves open with time again.
    Resume,
    /// The newest kept generation to everyone now (un-withdrawn).
    Promote,
    /// Withdraw the newest served generation: the nodes that took it
    /// return to the newest that reached each of them; nothing is promoted.
    /// Naming it makes the command idempotent: a rollback of a generation
    /// already withdrawn changes nothing, one of a generation that is not
    /// the newest served is refused (docs/rollouts.md#commands).
    Rollback(Option<GenerationId>),
}

impl Action {
    /// Its name in the command history and log lines.
    pub fn name(self) -> &'static str {
        match self {
            Action::Halt => "halt",
            Action::Resume => "resume",
            Action::Promote => "promote",
            Action::Rollback(_) => "rollback",
        }
    }
}

impl std::str::FromStr for Action {
    type Err = RolloutError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "halt" => Ok(Action::Halt),
            "resume" => Ok(Action::Resume),
            "promote" => Ok(Action::Promote),
            "rollback" => Ok(Action::Rollback(None)),
            other => Err(RolloutError::UnknownAction(other.to_owned())),
        }
    }
}

/// A command that could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// Not halt, resume, promote or rollback.
    #[error("unknown rollout action '{0}' (halt, resume, promote, rollback)")]
    UnknownAction(String),
    /// The environment keeps no generation.
    #[error("environment '{0}' keeps no generation")]
    NoGeneration(String),
    /// Rollback with a single generation left to serve.
    #[error("environment '{0}' keeps no earlier generation to roll back to")]
    NothingEarlier(String),
    /// A rollback named a generation `env` does not keep (or more than one,
    /// for a short prefix).
    #[error("environment '{env}' keeps no generation '{named}'{why}")]
    UnknownGeneration {
        /// The environment.
        env: String,
        /// What the command named.
        named: String,
        /// Why not, when a prefix matched several.
        why: &'static str,
    },
    /// A rollback named a served generation that is not the newest served.
    #[error(
        "generation {named} of '{env}' is not the newest served ({newest} is): \
         a rollback withdraws the newest"
    )]
    NotNewest {
        /// The environment.
        env: String,
        /// The generation named (short).
        named: String,
        /// The newest served (short).
        newest: String,
    },
    /// The state store did not take the command: it is not applied.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Rollouts {
    /// Applies an operator's `action` on `env`, issued by `by`; persisted
    /// before it returns.
    pub fn apply(
        &self,
        gens: &Generations,
        env: &EnvName,
        action: Action,
        by: &str,
    ) -> Result<Command, RolloutError> {
        self.apply_to(&gens.kept(env), env, action, by)
    }

    /// The generation of `env` that `text` names for a rollback: its 64
    /// hex digits, or a prefix of at least 12 (as `rollout status` prints
    /// them) that only one kept generation has.
    pub fn named(
        gens: &Generations,
        env: &EnvName,
        text: &str,
    ) -> Result<GenerationId, RolloutError> {
        named_in(&gens.kept(env), env, text)
    }

    /// [`Rollouts::apply`] on `kept`, `env`'s kept generations newest first.
    pub(super) fn apply_to(
        &self,
        kept: &[Kept],
        env: &EnvName,
        action: Action,
        by: &str,
    ) -> Result<Command, RolloutError> {
        let newest = kept
            .first()
            .ok_or_else(|| RolloutError::NoGeneration(env.to_string()))?
            .id;
        // On the state as the database holds it now (another replica's
        // command included); refused at once when it does not answer.
        self.refresh()?;
        let cmd = self.command(env);
        let serving: Vec<GenerationId> = kept
            .iter()
            .map(|k| k.id)
            .filter(|id| !cmd.withdrawn.contains(id))
            .collect();
        if let Action::Rollback(Some(named)) = action {
            // Already withdrawn: the same command again (a retry, or sent
            // to two replicas of one database) changes nothing.
            if cmd.withdrawn.contains(&named) {
                return Ok(cmd);
            }
            if serving.first().is_some_and(|newest| *newest != named) {
                return Err(RolloutError::NotNewest {
                    env: env.to_string(),
                    named: named.short(),
                    newest: serving[0].short(),
                });
            }
        }
        if matches!(action, Action::Rollback(_)) && serving.len() < 2 {
            return Err(RolloutError::NothingEarlier(env.to_string()));
        }
        tracing::warn!(env = %env, by, action = action.name(), "rollout command");
        let now = self.now();
        let next = self.next(env, |c| match action {
            // A halt already in force keeps its time: a second one (the
            // same command sent to two replicas of one database) must not
            // move the frozen shares forward (docs/rollouts.md#replicas).
            Action::Halt => {
                c.halt.get_or_insert_with(|| Halt {
                    at: now,
                    reason: format!("halted by {by}"),
                });
            }
            Action::Resume => {
                c.halt = None;
                c.waived = serving.first().copied();
            }
            Action::Promote => {
                c.halt = None;
                c.withdrawn.retain(|w| *w != newest);
                if let Some(before) = c.promoted.replace(newest).filter(|b| *b != newest) {
                    c.promoted_before.retain(|b| *b != before && *b != newest);
                    c.promoted_before.push(before);
                    let over = c.promoted_before.len().saturating_sub(MAX_SEEN);
                    c.promoted_before.drain(..over);
                }
            }
            // Withdraw only: placement then serves each node the newest
            // generation that reached it, so the nodes that took this one
            // return to what each had and no other node moves
            // (docs/rollouts.md#commands).
            Action::Rollback(_) => {
                c.halt = None;
                c.withdrawn.push(serving[0]);
                let over = c.withdrawn.len().saturating_sub(MAX_SEEN);
                c.withdrawn.drain(..over);
            }
        });
        self.commit(env, next.clone(), action.name(), by)?;
        Ok(next)
    }

    /// `env`'s state changed by `f` under the next clock (not kept yet:
    /// [`Rollouts::commit`]).
    pub(super) fn next(&self, env: &EnvName, f: impl FnOnce(&mut Command)) -> Command {
        let st = lock(&self.state);
        let mut c = st.environments.get(env).cloned().unwrap_or_default();
        f(&mut c);
        // A count, not a tie-break: at its end it stays there.
        c.clock = c.clock.saturating_add(1);
        c.origin = st.origin.clone();
        c
    }

    /// Writes `c` as `env`'s state (one transaction, with its history row:
    /// `action` by `by`), then takes it; not taken if the store refused.
    pub(super) fn commit(
        &self,
        env: &EnvName,
        c: Command,
        action: &str,
        by: &str,
    ) -> Result<(), StoreError> {
        self.store
            .write_commands(&[persist::row_of(env, &c)], action, by)?;
        lock(&self.state).environments.insert(env.clone(), c);
        Ok(())
    }
}
