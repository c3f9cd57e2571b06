//! The `pluginsync-master rollout` command (docs/rollouts.md#commands):
//! the client side of the rollout calls of the admin API, through the
//! admin client of [`crate::reindex`].

use pluginsync_common::envname::EnvName;

use crate::config::MasterConfig;
use crate::reindex::{Answer, ReindexError, call};
use crate::rollout::api::{ROLLOUT_PATH, RolloutStatus};

/// Why `pluginsync-master rollout` failed on a master.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// `ENV` is not an environment name.
    #[error(transparent)]
    Environment(#[from] pluginsync_common::envname::InvalidEnvName),
    /// The call could not be made.
    #[error(transparent)]
    Call(#[from] ReindexError),
    /// The master refused or failed the command.
    #[error("the master at {addr} answered {status}: {body}")]
    Status {
        /// The master's address.
        addr: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The answer is not a rollout status.
    #[error("the master at {addr} answered no rollout status")]
    Unreadable {
        /// The master's address.
        addr: String,
    },
}

/// `pluginsync-master rollout ACTION ENV` against `masters` (the
/// config's own master when empty), each master's status or error in
/// order. `status` asks each. A command is applied once: by the first
/// master that answers it (replicas share their commands through the
/// state store, docs/rollouts.md#replicas, so sending a rollback to two
/// replicas would withdraw two generations); a master before it that
/// could not be reached says so, and every master after it is asked for
/// its status once that shows the command (within [`SETTLE`]).
pub async fn run(
    config: &MasterConfig,
    action: &str,
    env: &str,
    masters: &[String],
) -> Vec<(String, Result<RolloutStatus, CommandError>)> {
    let targets: Vec<Option<&str>> = if masters.is_empty() {
        vec![None]
    } else {
        masters.iter().map(|m| Some(m.as_str())).collect()
    };
    let mut out = Vec::new();
    let mut applied: Option<u64> = None;
    for t in targets {
        let name = t.unwrap_or("(local)").to_owned();
        let answer = match (action, applied) {
            ("status", _) => one(config, "status", env, t).await,
            (_, None) => {
                let answer = one(config, action, env, t).await;
                applied = answer.as_ref().ok().map(|s| s.clock);
                answer
            }
            (_, Some(clock)) => settled(config, env, t, clock).await,
        };
        out.push((name, answer));
    }
    out
}

/// How long a replica may take to show a command another applied (it
/// reads the commands from the state store each second).
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// `master`'s status once its commands' clock reaches `clock` (or after
/// [`SETTLE`], as it is then).
async fn settled(
    config: &MasterConfig,
    env: &str,
    master: Option<&str>,
    clock: u64,
) -> Result<RolloutStatus, CommandError> {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let status = one(config, "status", env, master).await;
        let done = status.as_ref().map_or(true, |s| s.clock >= clock);
        if done || tokio::time::Instant::now() >= deadline {
            return status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

async fn one(
    config: &MasterConfig,
    action: &str,
    env: &str,
    master: Option<&str>,
) -> Result<RolloutStatus, CommandError> {
    let env: EnvName = env.parse()?;
    let (method, target) = match action {
        "status" => ("GET", format!("{ROLLOUT_PATH}?environment={env}")),
        // Named: a rollback this master already applied (a retry after a
        // lost answer) is then a no-op, not a second withdrawal
        // (docs/rollouts.md#commands).
        "rollback" => {
            let status = Box::pin(one(config, "status", env.as_str(), master)).await?;
            let named = (status.generations.iter())
                .find(|g| !g.withdrawn)
                .map(|g| format!("&generation={}", g.id))
                .unwrap_or_default();
            (
                "POST",
                format!("{ROLLOUT_PATH}?environment={env}&action=rollback{named}"),
            )
        }
        a => (
            "POST",
            format!("{ROLLOUT_PATH}?environment={env}&action={a}"),
        ),
    };
    let Answer { addr, status, body } = call(config, master, method, &target).await?;
    if status != 200 {
        let body: String = body.chars().filter(|c| !c.is_control()).take(200).collect();
        return Err(CommandError::Status { addr, status, body });
    }
    serde_json::from_str(&body).map_err(|_| CommandError::Unreadable { addr })
}

/// One line per generation of `s`, for `rollout status` in text.
pub fn text(master: &str, s: &RolloutStatus) -> String {
    let mut out = format!(
        "{master}: {} {}{}\n",
        s.environment,
        if s.halted { "halted" } else { "rolling" },
        s.reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    if let Some(why) = &s.degraded {
        out.push_str(&format!("  degraded: {why}\n"));
    }
    for g in &s.generations {
        let nodes = g
            .nodes
            .map(|n| format!(", {n} nodes, {} failing", g.failing_nodes.unwrap_or(0)))
            .unwrap_or_default();
        let flags = match (g.withdrawn, g.promoted) {
            (true, _) => " withdrawn",
            (_, true) => " promoted",
            _ => "",
        };
        // A master that predates `state` says only the share and the flags.
        let state = match g.state.is_empty() {
            true => format!("{}% open{flags}", g.open_percent),
            false => g.state.clone(),
        };
        let label = g
            .label
            .as_ref()
            .map(|l| format!(" [{l}]"))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {} {}{label} {state}{nodes}\n",
            &g.id[..12],
            g.published
        ));
    }
    out
}
