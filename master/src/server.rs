//! Serving: listeners, TLS, timeouts, signals.
//!
//! [`serve`] takes already-bound listeners (tests bind `127.0.0.1:0`, the
//! binary binds `listen`) and a shutdown future. SIGHUP reloads the TLS
//! files (certificate rotation, a new CRL) without dropping connections,
//! and re-indexes every environment (the explicit publish,
//! docs/deploys.md#the-explicit-signal);
//! SIGTERM/SIGINT make the health check answer 503 for `shutdown_grace`, so
//! load balancers drain this replica, then stop accepting and give open
//! requests `shutdown_grace` to finish.
//!
//! Every connection goes through [`conns`] (admitted by [`accept`], its
//! requests counted by [`inflight`]; the `[metrics]` listener's in a
//! registry of its own, of [`METRICS_CONNECTIONS`]): `max_connections`,
//! `idle_timeout` and `write_timeout` bound how many sockets and how much
//! memory clients can hold, and after a SIGHUP the open connections whose
//! client certificate the new CA/CRL refuses are closed (a revoked node
//! cannot keep reading over a keep-alive or HTTP/2 connection).
//!
//! `[proxy] listen` adds plain-HTTP listeners for a TLS-terminating
//! balancer (docs/protocol.md §5.5): same routes, state and registry, the
//! identity from the trusted proxy's headers; SIGHUP reloads the verifier
//! of their certificate headers with the rest of the TLS files.

mod accept;
mod conns;
mod inflight;
mod rollouts;
mod scrubber;

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum_server::Handle;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use hyper_util::rt::TokioTimer;
use rustls::server::danger::ClientCertVerifier;

pub use conns::{ConnStats, Connections, Limits};

use crate::auth::{Authorizer, Gate};
use crate::config::MasterConfig;
use crate::metrics::Snapshot;
use crate::proxy::Trust;
use crate::state::AppState;
use crate::store::Store;

/// HTTP/2 receive windows: the master only takes GET requests, so small
/// windows bound what a client can make it buffer.
const H2_STREAM_WINDOW: u32 = 64 * 1024;
const H2_CONNECTION_WINDOW: u32 = 256 * 1024;
/// Request header block size limit on HTTP/2 (hyper's default is 16 MiB).
const H2_MAX_HEADER_LIST: u32 = 64 * 1024;
/// Connections the metrics listener keeps open at most (a scraper or two
/// need one each), in a registry of its own and taken from what
/// `max_connections` may use of the descriptor limit.
const METRICS_CONNECTIONS: usize = 16;

/// Which listener an error is about, as its messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// An mTLS listener (`listen`).
    Tls(SocketAddr),
    /// A `[proxy] listen` address.
    Proxy(SocketAddr),
    /// `[metrics] listen`.
    Metrics(SocketAddr),
}

impl std::fmt::Display for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listener::Tls(a) => write!(f, "{a}"),
            Listener::Proxy(a) => write!(f, "{a} for [proxy]"),
            Listener::Metrics(a) => write!(f, "{a} for metrics"),
        }
    }
}

/// Why serving could not start, or stopped with an error. The binary
/// prints it as one line, each cause after `: `.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The TLS files do not make a server config or a verifier.
    #[error(transparent)]
    Tls(#[from] crate::tls::ServerTlsError),
    /// `[[authorization]]` or `[proxy]` cannot work.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The watcher could not start.
    #[error(transparent)]
    Watch(#[from] crate::watch::WatchError),
    /// The generation store cannot be opened (`[generations] dir`).
    #[error(transparent)]
    Generations(#[from] crate::generations::StoreError),
    /// The state store cannot be opened (`[state]`).
    #[error(transparent)]
    State(#[from] crate::statestore::StoreError),
    /// A listener could not be bound or set up.
    #[error("cannot listen on {0}")]
    Listen(Listener, #[source] std::io::Error),
    /// A `[proxy]` listener could not be made non-blocking.
    #[error("proxy listener {0}")]
    NonBlocking(SocketAddr, #[source] std::io::Error),
    /// A bound mTLS listener has no address.
    #[error("listener address")]
    Address(#[source] std::io::Error),
    /// A bound `[proxy]` listener has no address.
    #[error("proxy listener address")]
    ProxyAddress(#[source] std::io::Error),
    /// A listener stopped serving with an error.
    #[error("serving {}", match .0 {
        Listener::Proxy(a) => format!("[proxy] on {a}"),
        other => format!("on {other}"),
    })]
    Serving(Listener, #[source] std::io::Error),
    /// A listener's task panicked or was cancelled.
    #[error("server task")]
    Task(#[source] tokio::task::JoinError),
}

/// A running master, for callers that need its state (tests, `serve`).
#[derive(Debug, Clone)]
pub struct Running {
    /// The indexes and counters.
    pub store: Arc<Store>,
    /// The `[proxy]` listeners' bound addresses (a configured port 0 is
    /// the one the kernel chose).
    pub proxy: Vec<SocketAddr>,
    /// The metrics listener's bound address, if any.
    pub metrics: Option<SocketAddr>,
    /// What SIGHUP reloads.
    pub tls: Reload,
}

/// What SIGHUP acts on: the TLS config new handshakes use, and the open
/// connections, re-checked against the reloaded client verifier.
#[derive(Debug, Clone)]
pub struct Reload {
    /// The TLS config, reloadable.
    pub config: RustlsConfig,
    /// Every open connection, with its client certificate.
    pub connections: Arc<Connections>,
    /// The indexes: SIGHUP also re-indexes every environment (docs/deploys.md).
    pub store: Arc<Store>,
    /// The `[proxy]` listener's trust: its header verifier follows the CA and CRL.
    pub proxy: Option<Arc<Trust>>,
}

impl Reload {
    /// Reloads the TLS files of `config`: new handshakes use them at once;
    /// open connections whose client certificate the new files refuse
    /// (revoked, CA removed, expired) are closed. Returns how many.
    pub async fn reload(&self, config: &MasterConfig) -> Result<usize, crate::tls::ServerTlsError> {
        let server = crate::tls::server_tls(&config.tls)?;
        if let Some(trust) = &self.proxy {
            trust.set_verifier(crate::tls::client_verifier_for(&config.tls, false)?);
        }
        self.config.reload_from_config(Arc::new(server.config));
        self.store.certificate.set(server.validity);
        Ok(match server.client_verifier {
            Some(verifier) => recheck(self.connections.clone(), verifier).await,
            None => 0,
        })
    }
}

async fn recheck(connections: Arc<Connections>, verifier: Arc<dyn ClientCertVerifier>) -> usize {
    tokio::task::spawn_blocking(move || connections.recheck(verifier.as_ref()))
        .await
        .unwrap_or(0)
}

/// Serves on `listeners` until `shutdown` resolves, indexing environments
/// in the background and on demand. `ready` is called once every listener
/// accepts connections (the health check may still answer `starting`).
pub async fn serve(
    config: Arc<MasterConfig>,
    listeners: Vec<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(Running) + Send + 'static,
) -> Result<(), ServeError> {
    pluginsync_common::tls::install_default_provider();
    let served = crate::tls::server_tls(&config.tls)?;
    let tls = RustlsConfig::from_config(Arc::new(served.config));
    let metrics_connections = config.metrics.listen.map(|_| METRICS_CONNECTIONS);
    let connections = conns::registry(limits(&config.http), metrics_connections.unwrap_or(0));
    let mut background = vec![
        tokio::spawn(Connections::reap(Arc::downgrade(&connections))),
        tokio::spawn(watch_certificate(config.clone())),
    ];
    let authorizer = Authorizer::new(&config.authorization)?;
    let store = Store::new(config.store_settings());
    store.certificate.set(served.validity);
    // The watcher first: every build watches its environment before
    // walking it, the warmer's first builds included
    // (docs/master.md#many-environments).
    let _watcher = crate::watch::spawn(store.clone())?;
    // Nothing is indexed before listening (docs/master.md#many-environments):
    // the warmer indexes in the background, requests index on demand.
    store.generations.open(true)?;
    scrubber::start(&store, &config.generations);
    background.push(tokio::spawn(store.clone().retrier()));
    background.push(tokio::spawn(store.clone().warm()));
    background.push(tokio::spawn(Store::idle_dropper(
        Arc::downgrade(&store),
        config.index.idle_drop,
    )));
    let (fleet, rollouts) = rollouts::start(&config, &store, &mut background)?;
    let state = AppState {
        config: config.clone(),
        store: store.clone(),
        gate: Gate::new(authorizer, config.tls.client_auth.into()),
        rollouts,
        fleet: fleet.clone(),
        trust_timestamp: Default::default(),
    };
    let proxy = if config.proxy.listen.is_empty() {
        None
    } else {
        let verifier = crate::tls::client_verifier_for(&config.tls, false)?;
        Some(Arc::new(Trust::new(&config.proxy, verifier)?))
    };
    let handle: Handle<SocketAddr> = Handle::new();
    let listening = Listening {
        http: &config.http,
        connections: &connections,
        handle: &handle,
    };
    let metrics_bound = match config.metrics.listen {
        Some(addr) => Some(listening.metrics(addr, state.clone(), &mut background)?),
        None => None,
    };
    let mut servers = listening.tls(listeners, &tls, &store, state.clone())?;
    let proxy_bound = match &proxy {
        Some(trust) => listening.proxy(&config.proxy.listen, state, trust, &mut servers)?,
        None => Vec::new(),
    };
    ready(Running {
        store: store.clone(),
        proxy: proxy_bound,
        metrics: metrics_bound,
        tls: Reload {
            config: tls,
            connections,
            store: store.clone(),
            proxy,
        },
    });
    tokio::spawn(drain(shutdown, config.http.shutdown_grace, store, handle));
    for s in servers {
        s.await.map_err(ServeError::Task)??;
    }
    background.iter().for_each(tokio::task::JoinHandle::abort);
    fleet.flush();
    tracing::info!("stopped");
    Ok(())
}

/// The connection limits `[http]` asks for ([`conns::registry`] caps them).
fn limits(http: &crate::config::HttpConfig) -> Limits {
    Limits {
        max_connections: http.max_connections,
        max_per_client: http.max_connections_per_client,
        idle_timeout: http.idle_timeout,
        write_timeout: http.write_timeout,
    }
}

/// One listener's server task; its error names the listener.
type ServerTask = tokio::task::JoinHandle<Result<(), ServeError>>;

/// What every listener shares: the `[http]` limits, the connection
/// registry and the handle that shuts them all down.
struct Listening<'a> {
    http: &'a crate::config::HttpConfig,
    connections: &'a Arc<Connections>,
    handle: &'a Handle<SocketAddr>,
}

impl Listening<'_> {
    /// Serves the mTLS router on each of `listeners`.
    fn tls(
        &self,
        listeners: Vec<TcpListener>,
        tls: &RustlsConfig,
        store: &Arc<Store>,
        state: AppState,
    ) -> Result<Vec<ServerTask>, ServeError> {
        let app = crate::routes::router(state, self.http.request_timeout);
        let mut servers = Vec::new();
        for listener in listeners {
            let addr = listener.local_addr().map_err(ServeError::Address)?;
            // Admit (TCP_NODELAY, the connection limit, the socket wrapped
            // so the registry can close it), then TLS, then Identify (the
            // client's certificate recorded, its requests counted).
            let acceptor = accept::Identify::new(
                RustlsAcceptor::new(tls.clone())
                    .handshake_timeout(self.http.handshake_timeout)
                    .acceptor(accept::Admit::new(self.connections.clone())),
                store.clone(),
            );
            let server = self
                .server(listener, Listener::Tls(addr))?
                .acceptor(acceptor);
            let service = app
                .clone()
                .into_make_service_with_connect_info::<SocketAddr>();
            servers.push(spawn(server.serve(service), Listener::Tls(addr)));
            tracing::info!("listening on {addr}");
        }
        Ok(servers)
    }

    /// The `[proxy]` listeners (docs/protocol.md §5.5): plain HTTP, the
    /// same routes, state and connection registry (so `max_connections`
    /// and the idle and write timeouts count them too), the identity from
    /// a trusted proxy's headers. Each is added to `servers`; returns
    /// their bound addresses.
    fn proxy(
        &self,
        addrs: &[SocketAddr],
        state: AppState,
        trust: &Arc<Trust>,
        servers: &mut Vec<ServerTask>,
    ) -> Result<Vec<SocketAddr>, ServeError> {
        let app = crate::routes::proxy_router(state, self.http.request_timeout, trust.clone());
        let mut bounds = Vec::new();
        for addr in addrs {
            let listener = TcpListener::bind(addr)
                .map_err(|e| ServeError::Listen(Listener::Proxy(*addr), e))?;
            listener
                .set_nonblocking(true)
                .map_err(|e| ServeError::NonBlocking(*addr, e))?;
            let bound = listener.local_addr().map_err(ServeError::ProxyAddress)?;
            let server = self
                .server(listener, Listener::Proxy(*addr))?
                .acceptor(accept::AdmitPlain::new(self.connections.clone()));
            let service = app
                .clone()
                .into_make_service_with_connect_info::<SocketAddr>();
            servers.push(spawn(server.serve(service), Listener::Proxy(bound)));
            tracing::info!("proxy listening on {bound}");
            bounds.push(bound);
        }
        Ok(bounds)
    }

    /// Serves `GET /metrics` in the Prometheus text format on `addr`, plain
    /// HTTP (docs/operating.md#master-metrics), admitted like the `[proxy]`
    /// listeners but into its own registry `own` (at most
    /// [`METRICS_CONNECTIONS`], idle ones shed, `idle_timeout`,
    /// `write_timeout`) and under `header_timeout`: idle or dribbling
    /// connections to it can neither take the descriptors agents need nor
    /// shed an agent's connection. Its tasks are added to `background`;
    /// returns its bound address.
    fn metrics(
        &self,
        addr: SocketAddr,
        state: AppState,
        background: &mut Vec<tokio::task::JoinHandle<()>>,
    ) -> Result<SocketAddr, ServeError> {
        let own = Connections::new(Limits {
            max_connections: METRICS_CONNECTIONS,
            max_per_client: 0,
            ..self.connections.limits()
        });
        background.push(tokio::spawn(Connections::reap(Arc::downgrade(&own))));
        let scrape = Scrape {
            connections: self.connections.clone(),
            state,
        };
        let which = Listener::Metrics(addr);
        let listener = TcpListener::bind(addr).map_err(|e| ServeError::Listen(which, e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ServeError::Listen(which, e))?;
        let bound = listener.local_addr().unwrap_or(addr);
        let server = self
            .server(listener, which)?
            .acceptor(accept::AdmitPlain::new(own));
        let app = scrape.router();
        tracing::info!("metrics on http://{bound}/metrics");
        background.push(tokio::spawn(async move {
            if let Err(e) = server.serve(app.into_make_service()).await {
                tracing::error!(error = %e, "metrics listener failed");
            }
        }));
        Ok(bound)
    }

    /// An axum server on `listener` (which is `which`) with the `[http]`
    /// limits and the shared handle.
    fn server(
        &self,
        listener: TcpListener,
        which: Listener,
    ) -> Result<axum_server::Server<SocketAddr>, ServeError> {
        let mut server = axum_server::from_tcp(listener)
            .map_err(|e| ServeError::Listen(which, e))?
            .handle(self.handle.clone());
        limit_http(server.http_builder(), self.http);
        Ok(server)
    }
}

/// Runs the `serving` future of listener `which` as a task.
fn spawn(
    serving: impl Future<Output = std::io::Result<()>> + Send + 'static,
    which: Listener,
) -> ServerTask {
    tokio::spawn(async move { serving.await.map_err(|e| ServeError::Serving(which, e)) })
}

/// Once `shutdown` resolves: the health check answers 503 for `grace`
/// (load balancers drain this replica), then the listeners stop accepting
/// and open requests get `grace` to finish.
async fn drain(
    shutdown: impl Future<Output = ()>,
    grace: std::time::Duration,
    store: Arc<Store>,
    handle: Handle<SocketAddr>,
) {
    shutdown.await;
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "shutting down: draining"
    );
    store.draining.store(true, Ordering::Relaxed);
    tokio::time::sleep(grace).await;
    handle.graceful_shutdown(Some(grace));
}

/// The HTTP limits every listener applies: the header timeout, keep-alive,
/// and HTTP/2's stream count, windows and header list size.
fn limit_http(
    builder: &mut hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    http: &crate::config::HttpConfig,
) {
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(http.header_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(http.max_concurrent_streams)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_header_list_size(H2_MAX_HEADER_LIST);
}

/// Checks the server certificate at startup and then daily: an error line
/// when agents would refuse it, a warning within `[tls]
/// cert_expiry_warning` of its expiry (docs/tls.md#certificate-checks). A SIGHUP
/// that installs a new certificate is picked up by the next check.
async fn watch_certificate(config: Arc<MasterConfig>) {
    let mut daily = tokio::time::interval(std::time::Duration::from_secs(24 * 3600));
    loop {
        daily.tick().await;
        match crate::tls::server_certificate_check(
            &config.tls,
            std::time::SystemTime::now(),
            config.tls.cert_expiry_warning,
        ) {
            Ok(None) => {}
            Ok(Some(warning)) => tracing::warn!("{warning}"),
            Err(e) => tracing::error!("{e}"),
        }
    }
}

/// What a scrape of the metrics listener reads.
#[derive(Clone)]
struct Scrape {
    /// The agents' registry (mTLS and `[proxy]`), whose counts are served.
    connections: Arc<Connections>,
    /// The gate's refusals and the rollouts' halts are served.
    state: AppState,
}

impl Scrape {
    /// The metrics listener's one route, `GET /metrics`, rendered from a
    /// snapshot taken at scrape time.
    fn router(self) -> axum::Router {
        axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let Scrape { connections, state } = self.clone();
                async move {
                    let text = tokio::task::spawn_blocking(move || {
                        let metrics = &state.store.metrics;
                        metrics.render(&snapshot(&connections, &state))
                    })
                    .await
                    .unwrap_or_default();
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        text,
                    )
                }
            }),
        )
    }
}

/// What the metrics read at scrape time (`metrics::Snapshot`).
fn snapshot(connections: &Connections, state: &AppState) -> Snapshot {
    let store = &*state.store;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let s = &store.stats;
    let c = connections.stats();
    let tls = &state.config.tls;
    Snapshot {
        state_store_up: state.rollouts.degraded().is_none(),
        open_connections: c.open as u64,
        connections_evicted: c.evicted,
        connections_refused: c.refused,
        connections_refused_per_client: c.refused_per_client,
        listing_cache_hits: load(&s.listing_cache_hits),
        listing_cache_misses: load(&s.listings_serialised),
        listing_cache_evictions: load(&s.listing_cache_evictions),
        listings_not_modified: load(&s.listings_not_modified),
        listings_delta: load(&s.listings_delta),
        files_hashed: load(&s.files_hashed),
        watch_events: load(&s.watch_events),
        authorization_refusals: state.gate.refusals(),
        server_certificate_expiry: crate::tls::certificate_expiry(&tls.cert),
        crl_next_update: tls.crl.as_deref().and_then(crate::tls::crl_next_update),
        generation_store_bytes: store.generations.bytes() + store.generations.index_bytes(),
        generation_evictions: load(&store.generations.evictions),
        generation_store_errors: load(&store.generations.errors),
        inconsistent_builds: load(&s.inconsistent_builds),
        generation_store_scrubbed_bytes: load(&store.generations.scrubbed_bytes),
        generation_store_corrupt: load(&store.generations.corrupt),
        rollouts: state.rollouts.gauges(&store.generations),
        generation_states: store.generation_states(),
        generations_kept: store.generations_kept(),
        fleet: state
            .fleet
            .counts(|e| store.generations.kept(e).iter().map(|k| k.id).collect()),
    }
}

/// Resolves on SIGTERM or SIGINT; SIGHUP reloads TLS and re-indexes every
/// environment in the meantime. The handlers are installed when this is
/// called, not when the future is first polled: the listeners start
/// before `serve` polls it, and a SIGHUP in between (a reload right after
/// start) would otherwise get the default action and end the master. A
/// SIGHUP before `serve` is ready waits for it.
pub fn signals(
    config: Arc<MasterConfig>,
    mut tls: tokio::sync::watch::Receiver<Option<Reload>>,
) -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    async move {
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = handlers else {
            tracing::error!("cannot install signal handlers");
            return std::future::pending().await;
        };
        loop {
            tokio::select! {
                _ = term.recv() => return,
                _ = int.recv() => return,
                _ = hup.recv() => {
                    let current = match tls.wait_for(Option::is_some).await {
                        Ok(ready) => ready.clone(),
                        Err(_) => continue,
                    };
                    let Some(current) = current else { continue };
                    match current.reload(&config).await {
                        Ok(closed) => tracing::info!(
                            closed,
                            "SIGHUP: TLS certificate, key, CA and CRL reloaded; closed the open connections whose client certificate is now refused"
                        ),
                        Err(e) => tracing::error!(error = %e, "SIGHUP: TLS reload failed, keeping the old files"),
                    }
                    current.store.reindex(None, "SIGHUP").await;
                }
            }
        }
    }
}
