//! Prometheus metrics of the master (docs/operating.md#master-metrics), served in the
//! Prometheus text format on `[metrics] listen`, a plain-HTTP port apart
//! from the mTLS one (off when unset).
//!
//! One [`Metrics`] per master, not a process-global recorder: tests run
//! several masters in one process. Two kinds of series:
//! - **recorded as they happen**, with labels: requests by endpoint and
//!   status, response bytes, the latency histogram, TLS handshakes by kind
//!   (full or resumed) and failures by reason, index builds per
//!   environment and those abandoned on a read error
//!   ([`Metrics::request`], [`Metrics::handshake`],
//!   [`Metrics::handshake_failure`], [`Metrics::index_built`],
//!   [`Metrics::index_error`]);
//! - **read at scrape time** from counters the master keeps anyway
//!   ([`Stats`], the connection registry, the TLS files): the caller
//!   hands them over as a [`Snapshot`] to [`Metrics::render`], so this
//!   module imports nothing of the master's.
//!
//! The fleet's series (`pluginsync_fleet_*`, [`FleetCount`]) are written
//! as text at each scrape, so a generation no longer kept leaves no
//! stale series (docs/operating.md#the-fleet).
//!
//! Names follow Prometheus' conventions: the `pluginsync_master_` prefix,
//! base units (seconds, bytes), `_total` on counters, timestamps as
//! `_timestamp_seconds`; label values are bounded (endpoint names, status
//! codes, reasons, environment names — never paths or certnames).

mod rollout;

pub use rollout::RolloutGauge;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use metrics::{Key, Label, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// Counters, exposed for tests and `/metrics`-style introspection.
#[derive(Debug, Default)]
pub struct Stats {
    /// Files actually read and hashed (digest reuse does not count).
    pub files_hashed: AtomicU64,
    /// Environment index builds completed.
    pub index_builds: AtomicU64,
    /// Environments indexed now (held in memory).
    pub environments_indexed: AtomicU64,
    /// Indexes dropped for being idle (`index.idle_drop`).
    pub idle_drops: AtomicU64,
    /// Listings answered with a body (200).
    pub listings_sent: AtomicU64,
    /// Listings answered `304 Not Modified`.
    pub listings_not_modified: AtomicU64,
    /// Listings answered with a delta (226, docs/protocol.md §7.5).
    pub listings_delta: AtomicU64,
    /// File bodies sent (`file_content` and blobs).
    pub contents_sent: AtomicU64,
    /// Listing requests answered from the listing cache (200 and 304).
    pub listing_cache_hits: AtomicU64,
    /// Listings serialised on the request path (cache misses); the
    /// standard listings are serialised by the index build instead.
    pub listings_serialised: AtomicU64,
    /// Listings evicted from the listing caches.
    pub listing_cache_evictions: AtomicU64,
    /// Filesystem events the watcher received.
    pub watch_events: AtomicU64,
    /// Deploys the watcher noticed and held back until they settled
    /// (docs/deploys.md).
    pub deploys_held: AtomicU64,
    /// Environment directories the watcher watches now (real paths).
    pub watched_environments: AtomicU64,
    /// Explicit re-indexes: the admin API, `reindex`, SIGHUP.
    pub reindexes: AtomicU64,
    /// Builds not published because the tree changed under the walk
    /// (docs/deploys.md#consistent-builds).
    pub inconsistent_builds: AtomicU64,
}

/// Latency buckets (seconds): 1 ms to 10 s.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Index build buckets (seconds): 10 ms to 5 min.
const BUILD_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0];

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

const REQUESTS: &str = "pluginsync_master_http_requests_total";
const RESPONSE_BYTES: &str = "pluginsync_master_http_response_bytes_total";
const DURATION: &str = "pluginsync_master_http_request_duration_seconds";
const HANDSHAKES: &str = "pluginsync_master_tls_handshakes_total";
const HANDSHAKE_FAILURES: &str = "pluginsync_master_tls_handshake_failures_total";
const BUILDS: &str = "pluginsync_master_index_builds_total";
const INDEX_ERRORS: &str = "pluginsync_master_index_errors_total";
const BUILD_DURATION: &str = "pluginsync_master_index_build_duration_seconds";
const INDEX_FILES: &str = "pluginsync_master_index_files";
const INDEX_BYTES: &str = "pluginsync_master_index_bytes";
const GENERATIONS_KEPT: &str = "pluginsync_master_generations_kept";
const ROLLOUT_HALTED: &str = "pluginsync_rollout_halted";
const STATE_STORE_UP: &str = "pluginsync_state_store_up";

/// What is read at scrape time (see the module doc).
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// The state store answers (docs/operating.md#the-state-store).
    pub state_store_up: bool,
    /// Open client connections.
    pub open_connections: u64,
    /// Idle connections closed to make room at `max_connections`.
    pub connections_evicted: u64,
    /// Connections refused at `max_connections` (every one busy).
    pub connections_refused: u64,
    /// Connections closed at `max_connections_per_client` (every one of
    /// that client busy).
    pub connections_refused_per_client: u64,
    /// Listings answered from the listing cache.
    pub listing_cache_hits: u64,
    /// Listings serialised on the request path (cache misses).
    pub listing_cache_misses: u64,
    /// Listings evicted from the cache.
    pub listing_cache_evictions: u64,
    /// Listings answered `304 Not Modified`.
    pub listings_not_modified: u64,
    /// Listings answered `226 IM Used` with a delta (docs/protocol.md §7.5).
    pub listings_delta: u64,
    /// Files read and hashed by index builds.
    pub files_hashed: u64,
    /// Filesystem events the watcher received.
    pub watch_events: u64,
    /// Requests refused for their identity or by `[[authorization]]`.
    pub authorization_refusals: u64,
    /// When the server certificate expires (Unix seconds), if readable.
    pub server_certificate_expiry: Option<i64>,
    /// The CRL's `nextUpdate` (Unix seconds), if there is a CRL with one.
    pub crl_next_update: Option<i64>,
    /// Bytes of the generation store (docs/deploys.md#generations).
    pub generation_store_bytes: u64,
    /// Generations evicted since start.
    pub generation_evictions: u64,
    /// Publications the generation store failed.
    pub generation_store_errors: u64,
    /// Builds not published because the tree changed under the walk.
    pub inconsistent_builds: u64,
    /// Bytes the background scrub re-hashed (docs/deploys.md#scrubbing-the-store).
    pub generation_store_scrubbed_bytes: u64,
    /// Corrupt blobs and manifests it found.
    pub generation_store_corrupt: u64,
    /// Generations kept, by environment.
    pub generations_kept: Vec<(String, u64)>,
    /// Under `[trust] root`: kept generations by environment and state
    /// (`signed`, `unsigned`, `expired`, docs/trust.md#what-the-masters-serve).
    pub generation_states: Vec<(String, [(&'static str, u64); 3])>,
    /// Environments with a rollout policy: halted, share open, wave
    /// (`metrics/rollout.rs`).
    pub rollouts: Vec<RolloutGauge>,
    /// Nodes per environment and generation (docs/operating.md#the-fleet).
    pub fleet: Vec<FleetCount>,
}

/// One environment and generation label pair of the fleet series.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FleetCount {
    /// The environment.
    pub environment: String,
    /// A kept generation's id, `other` or `none`.
    pub generation: String,
    /// Nodes on it.
    pub nodes: u64,
    /// Of those, nodes reporting load failures.
    pub failing: u64,
}

/// The master's metrics.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics, every series described.
    pub fn new() -> Metrics {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(DURATION.into()),
                &LATENCY_BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full(BUILD_DURATION.into()),
                    &BUILD_BUCKETS,
                )
            })
            .expect("bucket lists are non-empty")
            .build_recorder();
        let handle = recorder.handle();
        let m = Metrics { recorder, handle };
        let counter = |name: &'static str, unit: Option<Unit>, help: &'static str| {
            m.recorder
                .describe_counter(name.into(), unit, SharedString::const_str(help))
        };
        counter(
            REQUESTS,
            None,
            "HTTP requests answered, by endpoint and status code.",
        );
        counter(
            RESPONSE_BYTES,
            Some(Unit::Bytes),
            "Response body bytes sent, by endpoint.",
        );
        counter(
            HANDSHAKES,
            None,
            "TLS handshakes completed, by kind: full, or resumed (a session ticket, no certificate signature).",
        );
        counter(
            HANDSHAKE_FAILURES,
            None,
            "TLS handshakes that failed, by reason.",
        );
        counter(BUILDS, None, "Index builds completed, by environment.");
        counter(
            INDEX_ERRORS,
            None,
            "Index builds abandoned because part of the environment could not be read (its previous index stays served), by environment.",
        );
        m.recorder.describe_histogram(
            DURATION.into(),
            Some(Unit::Seconds),
            SharedString::const_str(
                "Time from a request's arrival to its response headers, by endpoint.",
            ),
        );
        m.recorder.describe_histogram(
            BUILD_DURATION.into(),
            Some(Unit::Seconds),
            SharedString::const_str("Duration of index builds, by environment."),
        );
        m.recorder.describe_gauge(
            INDEX_FILES.into(),
            None,
            SharedString::const_str("Files served, by environment and mount."),
        );
        m.recorder.describe_gauge(
            INDEX_BYTES.into(),
            Some(Unit::Bytes),
            SharedString::const_str("Bytes of the files served, by environment and mount."),
        );
        m.recorder.describe_gauge(
            GENERATIONS_KEPT.into(),
            None,
            SharedString::const_str("Generations kept in the generation store, by environment."),
        );
        m.recorder.describe_gauge(
            ROLLOUT_HALTED.into(),
            None,
            SharedString::const_str(
                "1 while the rollout of an environment with a [[rollout]] policy is halted, else 0.",
            ),
        );
        m.recorder.describe_gauge(
            STATE_STORE_UP.into(),
            None,
            SharedString::const_str("1 while the state store answers, 0 while it does not."),
        );
        for (name, help) in SNAPSHOT_SERIES {
            if name.ends_with("_total") {
                counter(name, None, help);
            } else {
                m.recorder
                    .describe_gauge(name.into(), None, SharedString::const_str(help));
            }
        }
        m
    }

    fn key(name: &'static str, labels: &[(&'static str, String)]) -> Key {
        Key::from_parts(
            name,
            labels
                .iter()
                .map(|(k, v)| Label::new(*k, v.clone()))
                .collect::<Vec<_>>(),
        )
    }

    /// Records one answered request: `endpoint` (a bounded name such as
    /// `file_metadatas`), its status, the body bytes sent and the time to
    /// its response headers.
    pub fn request(&self, endpoint: &'static str, status: u16, latency: Duration) {
        // Every request passes here: its labels are borrowed, not
        // allocated, for the statuses the master answers.
        let e = Label::from_static_parts("endpoint", endpoint);
        let code = match status_text(status) {
            Some(text) => Label::from_static_parts("code", text),
            None => Label::new("code", status.to_string()),
        };
        self.recorder
            .register_counter(&Key::from_parts(REQUESTS, vec![e.clone(), code]), &METADATA)
            .increment(1);
        self.recorder
            .register_histogram(&Key::from_parts(DURATION, vec![e]), &METADATA)
            .record(latency.as_secs_f64());
    }

    /// Records body bytes sent for `endpoint`.
    pub fn response_bytes(&self, endpoint: &'static str, bytes: u64) {
        self.recorder
            .register_counter(
                &Self::key(RESPONSE_BYTES, &[("endpoint", endpoint.to_owned())]),
                &METADATA,
            )
            .increment(bytes);
    }

    /// Records a completed TLS handshake of `kind` (`full` or `resumed`).
    pub fn handshake(&self, kind: &'static str) {
        self.recorder
            .register_counter(
                &Self::key(HANDSHAKES, &[("kind", kind.to_owned())]),
                &METADATA,
            )
            .increment(1);
    }

    /// Records a failed TLS handshake.
    pub fn handshake_failure(&self, reason: &'static str) {
        self.recorder
            .register_counter(
                &Self::key(HANDSHAKE_FAILURES, &[("reason", reason.to_owned())]),
                &METADATA,
            )
            .increment(1);
    }

    /// Records an index build of `env`: its duration, and per mount the
    /// files served and their bytes.
    pub fn index_built(&self, env: &str, took: Duration, mounts: &[(&'static str, u64, u64)]) {
        let e = ("environment", env.to_owned());
        self.recorder
            .register_counter(&Self::key(BUILDS, std::slice::from_ref(&e)), &METADATA)
            .increment(1);
        self.recorder
            .register_histogram(
                &Self::key(BUILD_DURATION, std::slice::from_ref(&e)),
                &METADATA,
            )
            .record(took.as_secs_f64());
        for &(mount, files, bytes) in mounts {
            let labels = [e.clone(), ("mount", mount.to_owned())];
            self.recorder
                .register_gauge(&Self::key(INDEX_FILES, &labels), &METADATA)
                .set(files as f64);
            self.recorder
                .register_gauge(&Self::key(INDEX_BYTES, &labels), &METADATA)
                .set(bytes as f64);
        }
    }

    /// Records an index build of `env` abandoned on a read error
    /// (docs/master.md#unreadable-files).
    pub fn index_error(&self, env: &str) {
        self.recorder
            .register_counter(
                &Self::key(INDEX_ERRORS, &[("environment", env.to_owned())]),
                &METADATA,
            )
            .increment(1);
    }

    /// The Prometheus text exposition, `snapshot` included.
    pub fn render(&self, snapshot: &Snapshot) -> String {
        let s = snapshot;
        let values = [
            s.open_connections,
            s.connections_evicted,
            s.connections_refused,
            s.connections_refused_per_client,
            s.listing_cache_hits,
            s.listing_cache_misses,
            s.listing_cache_evictions,
            s.listings_not_modified,
            s.listings_delta,
            s.files_hashed,
            s.watch_events,
            s.authorization_refusals,
            s.generation_store_bytes,
            s.generation_evictions,
            s.generation_store_errors,
            s.inconsistent_builds,
            s.generation_store_scrubbed_bytes,
            s.generation_store_corrupt,
        ];
        let plain = SNAPSHOT_SERIES[..12].iter().chain(&SNAPSHOT_SERIES[14..]);
        for (&(name, _), value) in plain.zip(values) {
            if name.ends_with("_total") {
                self.recorder
                    .register_counter(&Key::from_static_name(name), &METADATA)
                    .absolute(value);
            } else {
                self.recorder
                    .register_gauge(&Key::from_static_name(name), &METADATA)
                    .set(value as f64);
            }
        }
        for (name, value) in [
            (SNAPSHOT_SERIES[12].0, snapshot.server_certificate_expiry),
            (SNAPSHOT_SERIES[13].0, snapshot.crl_next_update),
        ] {
            if let Some(v) = value {
                self.recorder
                    .register_gauge(&Key::from_static_name(name), &METADATA)
                    .set(v as f64);
            }
        }
        for (env, kept) in &snapshot.generations_kept {
            self.recorder
                .register_gauge(
                    &Self::key(GENERATIONS_KEPT, &[("environment", env.clone())]),
                    &METADATA,
                )
                .set(*kept as f64);
        }
        for g in &snapshot.rollouts {
            self.recorder
                .register_gauge(
                    &Self::key(ROLLOUT_HALTED, &[("environment", g.environment.clone())]),
                    &METADATA,
                )
                .set(if g.halted_since != 0 { 1.0 } else { 0.0 });
        }
        self.recorder
            .register_gauge(&Key::from_static_name(STATE_STORE_UP), &METADATA)
            .set(if snapshot.state_store_up { 1.0 } else { 0.0 });
        let mut text = self.handle.render();
        fleet_series(&mut text, &snapshot.fleet);
        rollout::rollout_series(&mut text, &snapshot.rollouts);
        rollout::generation_states_series(&mut text, &snapshot.generation_states);
        text
    }
}

/// Appends the fleet series: written at each scrape from the fleet as it
/// is, so a generation no longer kept leaves no stale series.
fn fleet_series(text: &mut String, counts: &[FleetCount]) {
    use std::fmt::Write;
    if counts.is_empty() {
        return;
    }
    for (name, help, value) in [
        (
            "pluginsync_fleet_nodes",
            "Nodes by the generation they last reported (or were served), by environment; generations not kept are summed as other.",
            (|c: &FleetCount| c.nodes) as fn(&FleetCount) -> u64,
        ),
        (
            "pluginsync_fleet_load_failures",
            "Nodes whose last report names failed loads, by environment and generation.",
            |c: &FleetCount| c.failing,
        ),
    ] {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
        for c in counts {
            let _ = writeln!(
                text,
                "{name}{{environment=\"{}\",generation=\"{}\"}} {}",
                c.environment,
                c.generation,
                value(c)
            );
        }
        text.push('\n');
    }
}

/// The series read at scrape time, with their help texts, in
/// [`Metrics::render`]'s order.
const SNAPSHOT_SERIES: [(&str, &str); 20] = [
    (
        "pluginsync_master_open_connections",
        "Client connections open now.",
    ),
    (
        "pluginsync_master_connections_evicted_total",
        "Idle connections closed to make room at http.max_connections or http.max_connections_per_client.",
    ),
    (
        "pluginsync_master_connections_refused_total",
        "Connections refused at http.max_connections, every open one busy.",
    ),
    (
        "pluginsync_master_connections_refused_per_client_total",
        "Connections closed at http.max_connections_per_client, every open one of that client busy.",
    ),
    (
        "pluginsync_master_listing_cache_hits_total",
        "Listings answered from the listing cache.",
    ),
    (
        "pluginsync_master_listing_cache_misses_total",
        "Listings serialised on the request path.",
    ),
    (
        "pluginsync_master_listing_cache_evictions_total",
        "Listings evicted from the listing cache.",
    ),
    (
        "pluginsync_master_listings_not_modified_total",
        "Listings answered 304 Not Modified.",
    ),
    (
        "pluginsync_master_listings_delta_total",
        "Listings answered 226 IM Used with a delta from a remembered listing.",
    ),
    (
        "pluginsync_master_files_hashed_total",
        "Files read and hashed by index builds.",
    ),
    (
        "pluginsync_master_watch_events_total",
        "Filesystem events received by the watcher.",
    ),
    (
        "pluginsync_master_authorization_refusals_total",
        "Requests refused for their client certificate or by [[authorization]].",
    ),
    (
        "pluginsync_master_server_certificate_expiry_timestamp_seconds",
        "When the server certificate expires (Unix time).",
    ),
    (
        "pluginsync_master_crl_next_update_timestamp_seconds",
        "The CRL's nextUpdate (Unix time).",
    ),
    (
        "pluginsync_master_generation_store_bytes",
        "Bytes of file contents, manifests and stored indexes in the generation store.",
    ),
    (
        "pluginsync_master_generation_evictions_total",
        "Generations evicted from the generation store (generations.keep, generations.max_mib).",
    ),
    (
        "pluginsync_master_generation_store_errors_total",
        "Index builds not published because the generation store could not be written.",
    ),
    (
        "pluginsync_master_inconsistent_builds_total",
        "Index builds not published because the environment changed during the walk (a link flipped).",
    ),
    (
        "pluginsync_master_generation_store_scrubbed_bytes_total",
        "Bytes of blobs and manifests the background scrub of the generation store hashed again.",
    ),
    (
        "pluginsync_master_generation_store_corrupt_total",
        "Blobs and manifests the background scrub found corrupt (each repaired or its generations withdrawn).",
    ),
];

/// The `code` label of the statuses the master answers, without an
/// allocation; `None` for any other.
fn status_text(status: u16) -> Option<&'static str> {
    Some(match status {
        200 => "200",
        206 => "206",
        226 => "226",
        304 => "304",
        400 => "400",
        403 => "403",
        404 => "404",
        406 => "406",
        413 => "413",
        416 => "416",
        429 => "429",
        500 => "500",
        503 => "503",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_series_appear_with_their_labels_and_help() {
        let m = Metrics::new();
        for _ in 0..3 {
            m.request("file_metadatas", 200, Duration::from_millis(3));
        }
        m.request("file_content", 404, Duration::from_millis(1));
        m.response_bytes("file_content", 1234);
        m.handshake_failure("unknown_ca");
        m.handshake("full");
        m.handshake("resumed");
        m.handshake("resumed");
        m.index_built(
            "production",
            Duration::from_millis(20),
            &[("plugins", 7, 700)],
        );
        m.index_error("staging");
        let text = m.render(&Snapshot {
            open_connections: 2,
            connections_refused_per_client: 3,
            listing_cache_hits: 5,
            server_certificate_expiry: Some(1_900_000_000),
            rollouts: vec![RolloutGauge {
                environment: "production".into(),
                open_percent: 20.0,
                wave: 1,
                halted_since: 1_900_000_000,
            }],
            fleet: vec![FleetCount {
                environment: "production".into(),
                generation: "other".into(),
                nodes: 7,
                failing: 2,
            }],
            ..Snapshot::default()
        });
        for want in [
            "pluginsync_master_http_requests_total{endpoint=\"file_metadatas\",code=\"200\"} 3",
            "pluginsync_master_http_requests_total{endpoint=\"file_content\",code=\"404\"} 1",
            "pluginsync_master_http_response_bytes_total{endpoint=\"file_content\"} 1234",
            "pluginsync_master_tls_handshake_failures_total{reason=\"unknown_ca\"} 1",
            "pluginsync_master_tls_handshakes_total{kind=\"full\"} 1",
            "pluginsync_master_tls_handshakes_total{kind=\"resumed\"} 2",
            "pluginsync_master_index_builds_total{environment=\"production\"} 1",
            "pluginsync_master_index_files{environment=\"production\",mount=\"plugins\"} 7",
            "pluginsync_master_index_errors_total{environment=\"staging\"} 1",
            "pluginsync_master_open_connections 2",
            "pluginsync_master_connections_refused_per_client_total 3",
            "pluginsync_master_listing_cache_hits_total 5",
            "# TYPE pluginsync_fleet_nodes gauge",
            "pluginsync_fleet_nodes{environment=\"production\",generation=\"other\"} 7",
            "pluginsync_fleet_load_failures{environment=\"production\",generation=\"other\"} 2",
            "pluginsync_master_server_certificate_expiry_timestamp_seconds 1900000000",
            "pluginsync_rollout_open_percent{environment=\"production\"} 20",
            "pluginsync_rollout_wave{environment=\"production\"} 1",
            "pluginsync_rollout_halted_since_timestamp_seconds{environment=\"production\"} 1900000000",
            "# HELP pluginsync_master_http_requests_total HTTP requests answered",
            "pluginsync_master_http_request_duration_seconds_bucket{endpoint=\"file_metadatas\",le=\"0.005\"} 3",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
    }
}
