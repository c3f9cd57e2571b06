//! Serving: listeners, TLS, timeouts, signals.
//!
//! [`serve`] takes already-bound listeners (tests bind `127.0.0.1:0`, the
//! binary binds `listen`) and a shutdown future. SIGHUP reloads the TLS
//! files (certificate rotation, a new CRL) without dropping connections;
//! SIGTERM/SIGINT make the health check answer 503 for `shutdown_grace`, so
//! load balancers drain this replica, then stop accepting and give open
//! requests `shutdown_grace` to finish.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context;
use axum_server::Handle;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use hyper_util::rt::TokioTimer;

use crate::auth::{Authorizer, Gate};
use crate::config::MasterConfig;
use crate::state::AppState;
use crate::store::Store;

/// A running master, for callers that need its state (tests, `serve`).
#[derive(Debug, Clone)]
pub struct Running {
    /// The indexes and counters.
    pub store: Arc<Store>,
    /// The TLS config, reloadable.
    pub tls: RustlsConfig,
}

/// Builds the indexes, then serves on `listeners` until `shutdown`
/// resolves. `ready` is called once every listener accepts connections.
pub async fn serve(
    config: Arc<MasterConfig>,
    listeners: Vec<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(Running) + Send + 'static,
) -> anyhow::Result<()> {
    pluginsync_common::tls::install_default_provider();
    let tls = RustlsConfig::from_config(Arc::new(crate::tls::server_config(&config.tls)?));
    let authorizer = Authorizer::new(&config.authorization)?;
    let store = Store::new(config.clone());
    store.rebuild(None).await;
    let _watcher = crate::watch::spawn(store.clone())?;
    let state = AppState {
        store: store.clone(),
        gate: Gate::new(authorizer, config.tls.client_auth.into()),
    };
    let app = crate::routes::router(state, config.http.request_timeout);
    let handle: Handle<SocketAddr> = Handle::new();
    let mut servers = Vec::new();
    for listener in listeners {
        let addr = listener.local_addr().context("listener address")?;
        let acceptor =
            // TCP_NODELAY: without it the client's small writes after the
            // handshake can meet a delayed ACK and stall a connection ~40 ms.
            RustlsAcceptor::new(tls.clone())
                .handshake_timeout(config.http.handshake_timeout)
                .acceptor(axum_server::accept::NoDelayAcceptor::new());
        let mut server = axum_server::from_tcp(listener)
            .with_context(|| format!("cannot listen on {addr}"))?
            .acceptor(acceptor)
            .handle(handle.clone());
        server
            .http_builder()
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(config.http.header_timeout)
            .keep_alive(true);
        server.http_builder().http2().timer(TokioTimer::new());
        let service = app.clone().into_make_service();
        servers.push(tokio::spawn(async move {
            server
                .serve(service)
                .await
                .with_context(|| format!("serving on {addr}"))
        }));
        tracing::info!("listening on {addr}");
    }
    ready(Running {
        store: store.clone(),
        tls: tls.clone(),
    });
    let grace = config.http.shutdown_grace;
    let drain_store = store.clone();
    let drain_handle = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "shutting down: draining"
        );
        drain_store.draining.store(true, Ordering::Relaxed);
        tokio::time::sleep(grace).await;
        drain_handle.graceful_shutdown(Some(grace));
    });
    for s in servers {
        s.await.context("server task")??;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT; SIGHUP reloads TLS in the meantime.
pub async fn signals(
    config: Arc<MasterConfig>,
    tls: tokio::sync::watch::Receiver<Option<RustlsConfig>>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => {
                let current = tls.borrow().clone();
                match (current, crate::tls::server_config(&config.tls)) {
                    (Some(rustls), Ok(cfg)) => {
                        rustls.reload_from_config(Arc::new(cfg));
                        tracing::info!("SIGHUP: TLS certificate, key, CA and CRL reloaded");
                    }
                    (_, Err(e)) => tracing::error!(error = %e, "SIGHUP: TLS reload failed, keeping the old files"),
                    (None, Ok(_)) => {}
                }
            }
        }
    }
}
