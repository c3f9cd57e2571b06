//! `GET /pluginsync/v1/inventory` (docs/protocol.md §7.11,
//! docs/operating.md#the-fleet): the fleet's nodes a page at a time,
//! filtered (`environment`, `generation`, `failing`), after a cursor
//! (`after`), at most `limit` (default 1,000, at most 10,000), each with
//! the generation placement gives it now and whether it lags behind it;
//! under `[trust] root`, whether its generation is signed.
//! The page itself is the fleet's one query ([`Fleet::page`]); placement
//! is asked through its pure decision (`placement::decide`).
//!
//! [`Fleet::page`]: crate::fleet::Fleet::page

use std::collections::HashMap;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use serde::{Deserialize, Serialize};

use crate::api_error::ApiError;
use crate::fleet::{DEFAULT_PAGE, MAX_PAGE, NodeEntry, Query as FleetQuery};
use crate::generations::Stamp;
use crate::placement::{Facts, Placement, decide};
use crate::request::Query;
use crate::rollout::Command;
use crate::state::AppState;

use super::admin::admitted;

/// A node of the inventory's page: its record, and where placement puts
/// it now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InventoryNode {
    /// What the fleet keeps of it.
    #[serde(flatten)]
    pub node: NodeEntry,
    /// The generation placement gives it now (`null`: none kept here).
    #[serde(default)]
    pub placed: Option<GenerationId>,
    /// Not on `placed` (docs/operating.md#the-fleet).
    #[serde(default)]
    pub lagging: bool,
    /// Under `[trust] root`: whether the node's generation is `signed`,
    /// `unsigned` or `expired` (docs/trust.md#what-the-masters-serve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed: Option<String>,
}

/// The answer: a page of nodes by certname, and the next page's cursor.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct InventoryPage {
    /// The nodes.
    pub nodes: Vec<InventoryNode>,
    /// Send as `after` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// A query that is not one: one line naming what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadQuery(String);

/// The query's filters, checked.
fn fleet_query(q: &Query) -> Result<FleetQuery, BadQuery> {
    let bad = BadQuery;
    let environment = match q.get("environment").filter(|e| !e.is_empty()) {
        Some(e) => Some(e.parse::<EnvName>().map_err(|e| bad(e.to_string()))?),
        None => None,
    };
    let generation = q.get("generation").filter(|g| !g.is_empty());
    if let Some(g) = generation
        && !(g.len() <= 64 && g.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(bad(format!("generation '{g}' is not a hex id or prefix")));
    }
    let failing = match q.get("failing") {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => return Err(bad(format!("failing must be true or false, not '{v}'"))),
    };
    let limit = match q.get("limit") {
        None => DEFAULT_PAGE,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| bad(format!("limit must be 1 to {MAX_PAGE}, not '{l}'")))?,
    };
    Ok(FleetQuery {
        environment,
        generation: generation.map(str::to_ascii_lowercase),
        failing,
        after: q.get("after").map(str::to_owned),
        limit,
    })
}

/// `GET /pluginsync/v1/inventory`: see the module docs; 403 like the
/// admin API, 400 for a query that is not one.
pub async fn inventory(State(state): State<AppState>, req: Request) -> Response {
    if let Err(refused) = admitted(&state, &req) {
        return refused.into_response();
    }
    let q = match fleet_query(&Query::parse(req.uri().query())) {
        Ok(q) => q,
        Err(e) => return ApiError::bad_request(e.to_string()).into_response(),
    };
    let body = tokio::task::spawn_blocking(move || serde_json::to_vec(&page(&state, &q))).await;
    match body {
        Ok(Ok(body)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        _ => ApiError::internal().into_response(),
    }
}

/// The page `q` asks for, each node placed.
fn page(state: &AppState, q: &FleetQuery) -> InventoryPage {
    let page = state.fleet.page(q);
    let mut envs: HashMap<String, Option<Env>> = HashMap::new();
    let nodes = (page.nodes.into_iter())
        .map(|node| {
            let env = envs
                .entry(node.environment.clone())
                .or_insert_with(|| Env::of(state, &node.environment));
            let placed = env.as_ref().and_then(|e| e.placed(state, &node));
            let lagging = placed.is_some_and(|p| node.generation != Some(p));
            let signatures = &state.store.signatures;
            let signed = (node.generation.zip(env.as_ref()))
                .filter(|_| signatures.is_on())
                .map(|(g, e)| signatures.state(&e.name, &g, None).label().to_owned());
            InventoryNode {
                node,
                placed,
                lagging,
                signed,
            }
        })
        .collect();
    InventoryPage {
        nodes,
        next: page.next,
    }
}

/// What placement reads of one environment, read once per page.
struct Env {
    name: EnvName,
    kept: Vec<crate::generations::Kept>,
    command: Command,
}

impl Env {
    fn of(state: &AppState, env: &str) -> Option<Env> {
        let name: EnvName = env.parse().ok()?;
        let kept = state.store.generations.kept(&name);
        let command = state.rollouts.command(&name);
        Some(Env {
            name,
            kept,
            command,
        })
    }

    /// The generation placement gives `node` now; its own when it is one
    /// this replica never kept and another master answers for it.
    fn placed(&self, state: &AppState, node: &NodeEntry) -> Option<GenerationId> {
        let policy = state.rollouts.policy(&self.name);
        let reported = node.generation;
        let facts = Facts {
            kept: &self.kept,
            command: &self.command,
            policy,
            position: pluginsync_common::rollout::position(self.name.as_str(), &node.certname),
            now: Stamp::now(),
            current: self.kept.first().map(|k| k.id),
            reported,
            elsewhere: reported.is_some_and(|r| state.rollouts.sends_elsewhere(&self.name, &r)),
            pin: None,
        };
        match decide(&facts) {
            Placement::Serve(k) => Some(k.id),
            Placement::Elsewhere(id) => Some(id),
            Placement::Pinned { pinned, .. } => Some(pinned),
            Placement::Current => None,
        }
    }
}
