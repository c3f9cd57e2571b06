//! `pluginsync-master inventory [ENVIRONMENT]` (docs/operating.md#the-fleet):
//! the fleet as an operator reads it at 3 a.m. It pages through
//! `GET /pluginsync/v1/inventory` (docs/protocol.md §7.11) through the
//! admin client of [`crate::reindex`] (the same TLS identity and
//! `--master` handling as `rollout`), filters, and prints either a table
//! (per generation: nodes, failing, lagging; then the nodes that lag or
//! fail, bounded, saying how many were left out) or, with `--format json`,
//! every node matched.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::config::MasterConfig;
use crate::fleet::{INVENTORY_PATH, MAX_PAGE};
use crate::handlers::inventory::{InventoryNode, InventoryPage};
use crate::reindex::{Answer, ReindexError, call_bounded};

/// The nodes that lag or fail listed under the table, at most.
pub const LISTED: usize = 25;
/// Nodes asked per page: the most the endpoint answers, so 100,000 nodes
/// are 10 calls (each its own TLS connection), not 100.
pub const PAGE: usize = MAX_PAGE;
/// The most bytes of one page's answer read: a page of [`PAGE`] nodes
/// each naming its 16 failing plugins at their longest fits.
const MAX_ANSWER: u64 = 80 << 20;

/// What to keep of the fleet.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    /// Only this environment.
    pub environment: Option<String>,
    /// Only nodes on a generation starting with this.
    pub generation: Option<String>,
    /// Only nodes on another generation (or none).
    pub not_generation: Option<String>,
    /// Only failing nodes.
    pub failing: bool,
    /// Only nodes not heard for this long.
    pub stale: Option<Duration>,
}

/// Why the inventory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The call could not be made.
    #[error(transparent)]
    Call(#[from] ReindexError),
    /// The master refused or failed.
    #[error("the master at {addr} answered {status}: {body}")]
    Status {
        /// The master's address.
        addr: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The answer is not an inventory page.
    #[error("the master at {addr} answered no inventory page")]
    Unreadable {
        /// The master's address.
        addr: String,
    },
}

/// Every node of the fleet `filters` keep, paging through the endpoint of
/// `master` (the config's own master when `None`).
pub async fn fetch(
    config: &MasterConfig,
    master: Option<&str>,
    filters: &Filters,
) -> Result<Vec<InventoryNode>, InventoryError> {
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let mut base = format!("{INVENTORY_PATH}?limit={PAGE}");
    if let Some(e) = &filters.environment {
        base.push_str(&format!("&environment={}", enc(e)));
    }
    if let Some(g) = &filters.generation {
        base.push_str(&format!("&generation={}", enc(g)));
    }
    if filters.failing {
        base.push_str("&failing=true");
    }
    let page_of = |after: Option<&str>| match after {
        Some(a) => format!("{base}&after={}", enc(a)),
        None => base.clone(),
    };
    let (mut out, mut after) = (Vec::new(), None::<String>);
    let mut answer = call_bounded(config, master, "GET", &page_of(None), MAX_ANSWER).await?;
    loop {
        let Answer { addr, status, body } = answer;
        if status != 200 {
            let body: String = body.chars().filter(|c| !c.is_control()).take(200).collect();
            return Err(InventoryError::Status { addr, status, body });
        }
        // The cursor first (a scan that keeps nothing else), so the next
        // page is asked while this one is parsed: the master builds one
        // while this process reads the other.
        let next = serde_json::from_str::<Cursor>(&body)
            .map_err(|_| InventoryError::Unreadable { addr: addr.clone() })?
            .next
            .filter(|n| after.as_ref() != Some(n));
        let parse =
            tokio::task::spawn_blocking(move || serde_json::from_str::<InventoryPage>(&body));
        let (page, fetched) = match &next {
            Some(n) => {
                let target = page_of(Some(n));
                let ask = call_bounded(config, master, "GET", &target, MAX_ANSWER);
                let (page, fetched) = tokio::join!(parse, ask);
                (page, Some(fetched))
            }
            None => (parse.await, None),
        };
        let page = (page.ok().and_then(Result::ok)).ok_or(InventoryError::Unreadable { addr })?;
        out.extend(page.nodes.into_iter().filter(|n| kept(filters, n)));
        match fetched {
            Some(fetched) => (answer, after) = (fetched?, next),
            None => return Ok(out),
        }
    }
}

/// An inventory page's cursor alone (the nodes skipped unread).
#[derive(serde::Deserialize)]
struct Cursor {
    #[serde(default)]
    next: Option<String>,
}

/// The filters the endpoint does not apply: `--not-generation`, `--stale`.
fn kept(filters: &Filters, n: &InventoryNode) -> bool {
    let hex = n.node.generation.map(|g| g.to_hex()).unwrap_or_default();
    let not = (filters.not_generation.as_deref())
        .is_none_or(|g| hex.is_empty() || !hex.starts_with(&g.to_ascii_lowercase()));
    let stale = filters
        .stale
        .is_none_or(|d| age(&n.node.last_seen) >= Some(d));
    not && stale
}

/// How long ago `rfc3339` was (`None`: unreadable).
fn age(rfc3339: &str) -> Option<Duration> {
    let when = humantime::parse_rfc3339(rfc3339).ok()?;
    Some(SystemTime::now().duration_since(when).unwrap_or_default())
}

/// One node as `--format json` lists it.
#[derive(Debug, Serialize)]
pub struct JsonNode<'a> {
    certname: &'a str,
    environment: &'a str,
    generation: Option<String>,
    label: Option<&'a str>,
    last_seen: &'a str,
    failing_plugins: &'a [String],
    placed: Option<String>,
    lagging: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    signed: Option<&'a str>,
}

/// `--format json`: every node matched, in certname order; `label` names
/// each generation's deploy where known.
pub fn json(nodes: &[InventoryNode], labels: &BTreeMap<String, String>) -> String {
    let list: Vec<JsonNode> = nodes
        .iter()
        .map(|n| {
            let generation = n.node.generation.map(|g| g.to_hex());
            JsonNode {
                certname: &n.node.certname,
                environment: &n.node.environment,
                label: generation
                    .as_ref()
                    .and_then(|g| labels.get(g))
                    .map(String::as_str),
                generation,
                last_seen: &n.node.last_seen,
                failing_plugins: &n.node.failed_plugins,
                placed: n.placed.map(|g| g.to_hex()),
                lagging: n.lagging,
                signed: n.signed.as_deref(),
            }
        })
        .collect();
    serde_json::to_string_pretty(&list).unwrap_or_default()
}

/// Per generation: nodes, failing, lagging.
#[derive(Debug, Default)]
struct Tally {
    nodes: u64,
    failing: u64,
    lagging: u64,
    /// Under `[trust] root`: signed, unsigned or expired.
    signed: Option<String>,
}

/// The table (module docs): per environment, a line of totals and one row
/// per generation; then at most [`LISTED`] nodes that lag or fail.
pub fn table(nodes: &[InventoryNode], labels: &BTreeMap<String, String>) -> String {
    let short = |g: Option<pluginsync_common::generation::GenerationId>| {
        g.map_or_else(|| "(none)".to_owned(), |g| g.short())
    };
    let mut by_env: BTreeMap<&str, BTreeMap<String, Tally>> = BTreeMap::new();
    for n in nodes {
        let g = n.node.generation.map(|g| g.to_hex()).unwrap_or_default();
        let t = by_env
            .entry(&n.node.environment)
            .or_default()
            .entry(g)
            .or_default();
        t.nodes += 1;
        t.failing += u64::from(n.node.load_failures > 0);
        t.lagging += u64::from(n.lagging);
        t.signed.clone_from(&n.signed);
    }
    let mut out = String::new();
    if nodes.is_empty() {
        out.push_str("no node matched\n");
    }
    for (env, gens) in &by_env {
        let sum = |f: fn(&Tally) -> u64| gens.values().map(f).sum::<u64>();
        out.push_str(&format!(
            "{env}: {} nodes, {} failing, {} lagging\n",
            sum(|t| t.nodes),
            sum(|t| t.failing),
            sum(|t| t.lagging)
        ));
        let signed = gens.values().any(|t| t.signed.is_some());
        let head = format!(
            "  {:<14}{:<22}{:>7}{:>9}{:>9}  {}",
            "GENERATION",
            "LABEL",
            "NODES",
            "FAILING",
            "LAGGING",
            if signed { "SIGNED" } else { "" }
        );
        out.push_str(head.trim_end());
        out.push('\n');
        let mut rows: Vec<_> = gens.iter().collect();
        rows.sort_by(|a, b| b.1.nodes.cmp(&a.1.nodes).then(a.0.cmp(b.0)));
        for (g, t) in rows {
            let id = if g.is_empty() { "(none)" } else { &g[..12] };
            let label = labels.get(g).map_or("-", String::as_str);
            let label: String = label.chars().take(20).collect();
            let row = format!(
                "  {id:<14}{label:<22}{:>7}{:>9}{:>9}  {}",
                t.nodes,
                t.failing,
                t.lagging,
                t.signed.as_deref().unwrap_or("")
            );
            out.push_str(row.trim_end());
            out.push('\n');
        }
    }
    let trouble: Vec<&InventoryNode> = (nodes.iter())
        .filter(|n| n.lagging || n.node.load_failures > 0)
        .collect();
    if trouble.is_empty() {
        return out;
    }
    let left = trouble.len().saturating_sub(LISTED);
    out.push_str(&format!(
        "\nnodes that lag or fail: {}{}\n",
        trouble.len(),
        match left {
            0 => String::new(),
            n => format!(" (the first {LISTED} listed, {n} left out: --format json lists every one)"),
        }
    ));
    out.push_str(&format!(
        "  {:<32}{:<14}{:<14}{:<26}{}\n",
        "CERTNAME", "GENERATION", "PLACED", "LAST SEEN", "FAILING PLUGINS"
    ));
    for n in trouble.iter().take(LISTED) {
        let mut failing = n.node.failed_plugins.join(", ");
        if failing.is_empty() && n.node.load_failures > 0 {
            failing = format!("{} failing", n.node.load_failures);
        }
        let row = format!(
            "  {:<32}{:<14}{:<14}{:<26}{}",
            n.node.certname,
            short(n.node.generation),
            short(n.placed),
            n.node.last_seen,
            failing
        );
        out.push_str(row.trim_end());
        out.push('\n');
    }
    out
}

/// Each generation's label (docs/operating.md#the-fleet) of the
/// environments of `nodes`, from the rollout status `master` answers (by
/// hex id); a master that cannot say gives none.
pub async fn labels(
    config: &MasterConfig,
    master: Option<&str>,
    nodes: &[InventoryNode],
) -> BTreeMap<String, String> {
    let envs: std::collections::BTreeSet<&str> =
        nodes.iter().map(|n| n.node.environment.as_str()).collect();
    let mut out = BTreeMap::new();
    for env in envs {
        let masters: Vec<String> = master.map(str::to_owned).into_iter().collect();
        for (_, status) in crate::rollout_client::run(config, "status", env, &masters).await {
            for g in status.map(|s| s.generations).unwrap_or_default() {
                if let Some(l) = g.label.filter(|l| !l.is_empty()) {
                    out.insert(g.id, l);
                }
            }
        }
    }
    out
}
