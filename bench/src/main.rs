//! `pluginsync-load`: a small HTTPS load generator that presents a client
//! certificate (wrk cannot), for the master's load figures in the bench.
//!
//! Opens `--connections` connections (HTTP/1.1 keep-alive by default, as
//! Puppet's agent uses; `--http2` multiplexes instead), each sending
//! requests back to back for `--duration`, and prints one JSON object:
//! requests, errors, requests per second, p50/p99 latency and status
//! counts. `--if-none-match auto` first fetches the URL's ETag and then
//! asks conditionally, to measure 304 answers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "pluginsync-load",
    about = "HTTPS load generator with client certificates"
)]
struct Args {
    /// The URL to request.
    #[arg(long)]
    url: String,
    /// CA bundle to trust.
    #[arg(long)]
    ca: PathBuf,
    /// Client certificate.
    #[arg(long)]
    cert: PathBuf,
    /// Client key.
    #[arg(long)]
    key: PathBuf,
    /// Concurrent connections.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// How long to send.
    #[arg(long, default_value = "5s")]
    duration: humantime::Duration,
    /// `auto`: fetch the ETag first and send it as If-None-Match.
    #[arg(long)]
    if_none_match: Option<String>,
    /// Send `Accept-Encoding: gzip` (bodies are not decompressed).
    #[arg(long)]
    gzip: bool,
    /// Use HTTP/2 (one multiplexed connection per client).
    #[arg(long)]
    http2: bool,
}

fn client(args: &Args) -> anyhow::Result<reqwest::Client> {
    let ca = std::fs::read(&args.ca).with_context(|| format!("reading {}", args.ca.display()))?;
    let mut id =
        std::fs::read(&args.cert).with_context(|| format!("reading {}", args.cert.display()))?;
    id.push(b'\n');
    id.extend(std::fs::read(&args.key).with_context(|| format!("reading {}", args.key.display()))?);
    let mut b = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca)?)
        .identity(reqwest::Identity::from_pem(&id)?)
        .pool_max_idle_per_host(1)
        .no_gzip();
    if !args.http2 {
        b = b.http1_only();
    }
    Ok(b.build()?)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    pluginsync_common::tls::install_default_provider();
    let inm = match args.if_none_match.as_deref() {
        Some("auto") => {
            let r = client(&args)?.get(&args.url).send().await?;
            Some(
                r.headers()
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .context("no ETag to revalidate")?
                    .to_owned(),
            )
        }
        other => other.map(str::to_owned),
    };
    let deadline = Instant::now() + Duration::from(args.duration);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.connections.max(1) {
        let c = client(&args)?;
        let (url, inm, gzip) = (args.url.clone(), inm.clone(), args.gzip);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
            let mut errors = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                let mut req = c.get(&url);
                if let Some(tag) = &inm {
                    req = req.header("If-None-Match", tag);
                }
                if gzip {
                    req = req.header("Accept-Encoding", "gzip");
                }
                match req.send().await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        match r.bytes().await {
                            Ok(_) => {
                                *statuses.entry(status).or_default() += 1;
                                lat.push(t.elapsed());
                            }
                            Err(_) => errors += 1,
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            (lat, statuses, errors)
        }));
    }
    let mut lat = Vec::new();
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    let mut errors = 0;
    for t in tasks {
        let (l, s, e) = t.await?;
        lat.extend(l);
        for (k, v) in s {
            *statuses.entry(k).or_default() += v;
        }
        errors += e;
    }
    let secs = started.elapsed().as_secs_f64();
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p).round().max(0.0) as usize)
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(0.0)
    };
    let out = serde_json::json!({
        "requests": lat.len(),
        "errors": errors,
        "seconds": secs,
        "rps": lat.len() as f64 / secs,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "statuses": statuses,
        "connections": args.connections,
    });
    println!("{out}");
    Ok(())
}
