//! The rollout calls of the admin API (docs/protocol.md §7.9) and the
//! `pluginsync-master rollout` command that makes them
//! (docs/rollouts.md#commands).
//!
//! `GET {ROLLOUT_PATH}?environment=ENV` answers the rollout's status;
//! `POST {ROLLOUT_PATH}?environment=ENV&action=ACTION` applies a command
//! and answers the new status; `GET {ROLLOUT_PATH}` without an environment
//! answers every environment's commands' state, which peers pull to
//! converge. Who may call them: as the re-index call, `[admin] certnames`
//! and the master's own certificate ([`crate::handlers::admin::admitted`]).

use std::sync::{Arc, Weak};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pluginsync_common::envname::EnvName;
use serde::{Deserialize, Serialize};

use super::{Action, Command, RolloutError, Rollouts, status_of};
use crate::api_error::ApiError;
use crate::config::MasterConfig;
use crate::generations::Generations;
use crate::handlers::admin::admitted;
use crate::reindex::{Answer, ReindexError, call};
use crate::request::Query;
use crate::state::AppState;
use crate::store::Store;

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
    /// Everyone's (promoted, or the target of a rollback).
    pub promoted: bool,
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
}

impl Rollouts {
    /// The status of `env`'s rollout.
    pub fn status(&self, gens: &Generations, env: &EnvName) -> RolloutStatus {
        let cmd = self.command(env.as_str());
        let policy = self.policy(env.as_str());
        let generations = gens
            .kept(env)
            .iter()
            .map(|k| {
                let (open_percent, waves_open) = status_of(policy, &cmd, k);
                let counts = self.fleet.get().map(|f| f.on_generation(env, &k.id));
                GenerationStatus {
                    id: k.id.to_hex(),
                    published: k.published.clone(),
                    withdrawn: cmd.withdrawn.contains(&k.id),
                    promoted: cmd.promoted == Some(k.id),
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
            halted: cmd.halted,
            reason: cmd.reason,
            clock: cmd.clock,
            generations,
        }
    }
}

fn json(status: StatusCode, value: &impl Serialize) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The environment a call names, if any; 400 for a malformed one.
fn environment(req: &Request) -> Result<Option<EnvName>, ApiError> {
    Query::parse(req.uri().query())
        .get("environment")
        .map(|e| e.parse::<EnvName>())
        .transpose()
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// `GET {ROLLOUT_PATH}[?environment=ENV]`: see the module docs.
pub async fn status(State(state): State<AppState>, req: Request) -> Response {
    if let Err(refused) = admitted(&state, &req) {
        return refused.into_response();
    }
    match environment(&req) {
        Err(e) => e.into_response(),
        Ok(None) => json(StatusCode::OK, &state.rollouts.commands()),
        Ok(Some(env)) => json(
            StatusCode::OK,
            &state.rollouts.status(&state.store.generations, &env),
        ),
    }
}

/// `POST {ROLLOUT_PATH}?environment=ENV&action=ACTION`: see the module
/// docs. 409 for a rollback with no earlier generation or a command on an
/// environment that keeps none.
pub async fn command(State(state): State<AppState>, req: Request) -> Response {
    let certname = match admitted(&state, &req) {
        Ok(c) => c,
        Err(refused) => return refused.into_response(),
    };
    let env = match environment(&req) {
        Ok(Some(env)) => env,
        Ok(None) => return ApiError::bad_request("an environment must be named").into_response(),
        Err(e) => return e.into_response(),
    };
    let action = match Query::parse(req.uri().query())
        .get("action")
        .unwrap_or_default()
        .parse::<Action>()
    {
        Ok(a) => a,
        Err(e) => return ApiError::bad_request(e.to_string()).into_response(),
    };
    let by = format!("admin API ({certname})");
    let applied = tokio::task::spawn_blocking(move || {
        let (r, g) = (&state.rollouts, &state.store.generations);
        r.apply(g, &env, action, &by).map(|_| r.status(g, &env))
    })
    .await;
    match applied {
        Ok(Ok(status)) => json(StatusCode::OK, &status),
        Ok(Err(e @ (RolloutError::NothingEarlier(_) | RolloutError::NoGeneration(_)))) => {
            ApiError::conflict(e.to_string()).into_response()
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "rollout command not applied");
            ApiError::internal().into_response()
        }
        Err(_) => ApiError::internal().into_response(),
    }
}

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

/// `pluginsync-master rollout ACTION ENV`: the call sent to each of
/// `masters` (the config's own master when empty), each master's status
/// or error in order.
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
    for t in targets {
        let name = t.unwrap_or("(local)").to_owned();
        out.push((name, one(config, action, env, t).await));
    }
    out
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

/// Pulls each peer's commands' state and adopts what is newer (docs/rollouts.md#replicas);
/// errors are logged at debug level (a peer down is retried next time).
pub async fn pull_peers(config: &MasterConfig, rollouts: &Rollouts, peers: &[String]) {
    for peer in peers {
        match call(config, Some(peer), "GET", ROLLOUT_PATH).await {
            Ok(Answer {
                status: 200, body, ..
            }) => {
                let Ok(theirs) =
                    serde_json::from_str::<std::collections::BTreeMap<String, Command>>(&body)
                else {
                    continue;
                };
                let mut adopted = false;
                for (env, c) in theirs {
                    if rollouts.merge(&env, c) {
                        tracing::info!(env, peer, "rollout state adopted from a peer");
                        adopted = true;
                    }
                }
                if adopted && let Err(e) = rollouts.save() {
                    tracing::error!(error = %e, "rollout state not written");
                }
            }
            Ok(a) => tracing::debug!(peer, status = a.status, "rollout state not pulled"),
            Err(e) => tracing::debug!(peer, error = %e, "rollout state not pulled"),
        }
    }
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
        out.push_str(&format!(
            "  {} {} {}% open{flags}{nodes}\n",
            &g.id[..12],
            g.published,
            g.open_percent
        ));
    }
    out
}

/// The rollouts of `store`'s config, their gate counting `fleet`, and
/// their [`background`] task.
pub fn start(
    store: &Arc<Store>,
    fleet: Arc<dyn super::FleetCounts>,
) -> (Arc<Rollouts>, tokio::task::JoinHandle<()>) {
    let rollouts = Arc::new(Rollouts::new(
        &store.config().rollout,
        store.generations.dir(),
    ));
    rollouts.set_fleet(fleet);
    rollouts.set_has_peers(!store.config().admin.peers.is_empty());
    let task = tokio::spawn(background(Arc::downgrade(store), Arc::downgrade(&rollouts)));
    (rollouts, task)
}

/// How often the state is pulled from the peers.
const PULL_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The rollouts' background work while the master serves: the gate and
/// the seen generations each second ([`Rollouts::tick`]), the peers'
/// state at start and every [`PULL_EVERY`]. Ends when the store is gone.
pub async fn background(store: Weak<Store>, rollouts: Weak<Rollouts>) {
    let mut last_pull: Option<tokio::time::Instant> = None;
    loop {
        let (Some(s), Some(r)) = (store.upgrade(), rollouts.upgrade()) else {
            return;
        };
        let peers = s.config().admin.peers.clone();
        if !peers.is_empty() && last_pull.is_none_or(|t| t.elapsed() >= PULL_EVERY) {
            last_pull = Some(tokio::time::Instant::now());
            pull_peers(s.config(), &r, &peers).await;
        }
        let _ = tokio::task::spawn_blocking(move || r.tick(&s.generations)).await;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
