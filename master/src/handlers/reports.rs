//! `POST /pluginsync/v1/reports/puppet`: a stock agent's Puppet run
//! report, as Puppet Server's `http` report processor posts it
//! (docs/protocol.md §7.10, docs/puppet-fleet.md#stock-agents-reports).
//!
//! Only from `[reports] puppetserver_certnames` (Puppet Server's own
//! certificate: it speaks for every node), 403 otherwise; the body at most
//! `[reports] max_body_mib` (413), read by [`crate::puppet_report`] off the
//! async runtime (400 when it is not a report). The node is the report's
//! `host`; its failures are counted on the generation the fleet says the
//! master served it, against that generation's manifest
//! ([`crate::puppet_report::plugins`]), and recorded through
//! [`crate::fleet::Fleet::heard_puppet_run`]. A report of a node the master
//! served nothing (or another generation since) is answered 204 and
//! recorded nowhere: Puppet Server logs an error for any other answer.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::{GenerationId, Manifest};

use crate::api_error::ApiError;
use crate::auth::PeerIdentity;
use crate::puppet_report::{self, ReportError, plugins};
use crate::state::AppState;

/// The endpoint's path.
pub const PUPPET_REPORTS: &str = "/pluginsync/v1/reports/puppet";

/// What a report came to.
enum Outcome {
    /// Recorded: the plugins it blames (maybe none: a clean run).
    Recorded(Vec<(String, plugins::Reason)>),
    /// Not a node on a generation served here (why, a fixed phrase).
    Ignored(&'static str),
}

/// `POST /pluginsync/v1/reports/puppet` (module docs).
pub async fn puppet_report(State(state): State<AppState>, req: Request) -> Response {
    let caller = req
        .extensions()
        .get::<PeerIdentity>()
        .and_then(|i| i.certname().map(str::to_owned));
    let config = &state.config.reports;
    let Some(caller) = (caller.clone()).filter(|c| config.puppetserver_certnames.contains(c))
    else {
        tracing::warn!(
            certname = caller.as_deref().unwrap_or("-"),
            "Puppet report refused: the caller is not in [reports] puppetserver_certnames"
        );
        return ApiError::forbidden(req.uri().path()).into_response();
    };
    let max = config.max_body();
    let Ok(body) = axum::body::to_bytes(req.into_body(), max).await else {
        tracing::warn!(
            certname = caller,
            "Puppet report refused: larger than [reports] max_body_mib"
        );
        let mut e = ApiError::bad_request(format!(
            "the report is larger than [reports] max_body_mib ({} MiB)",
            max >> 20
        ));
        e.status = StatusCode::PAYLOAD_TOO_LARGE;
        return e.into_response();
    };
    let worker = state.clone();
    let done = tokio::task::spawn_blocking(move || read_and_record(&worker, &body)).await;
    match done {
        Ok(Ok((host, Outcome::Recorded(failing)))) => {
            let names: Vec<String> = failing
                .iter()
                .map(|(n, r)| format!("{n} ({})", r.as_str()))
                .collect();
            tracing::info!(
                node = host,
                failing = failing.len(),
                plugins = names.join(", "),
                "Puppet run report recorded"
            );
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(Ok((host, Outcome::Ignored(why)))) => {
            tracing::debug!(node = host, why, "Puppet run report not recorded");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(Err(e)) => {
            tracing::warn!(certname = caller, error = %e, "Puppet report refused");
            ApiError::bad_request(e.to_string()).into_response()
        }
        Err(_) => ApiError::internal().into_response(),
    }
}

/// Reads `body` and records what it blames: the node's certname and the
/// outcome, or why the body is refused (one line, never its text).
fn read_and_record(state: &AppState, body: &[u8]) -> Result<(String, Outcome), ReportError> {
    let text = std::str::from_utf8(body).map_err(|_| ReportError::NotAReport("not UTF-8"))?;
    let report = puppet_report::parse(text)?;
    if !crate::auth::is_valid_certname(&report.host) {
        return Err(ReportError::NotAReport("its host is not a certname"));
    }
    let host = report.host.clone();
    let Some(record) = state.fleet.record_of(&host) else {
        return Ok((host, Outcome::Ignored("no record of the node")));
    };
    let (Ok(env), Some(generation)) = (record.environment.parse::<EnvName>(), record.generation)
    else {
        return Ok((host, Outcome::Ignored("no generation served to the node")));
    };
    if record.source != crate::fleet::Source::Served || report.environment != env.as_str() {
        return Ok((
            host,
            Outcome::Ignored("not a stock agent of this environment"),
        ));
    }
    let Some(manifest) = manifest(state, &env, &generation) else {
        return Ok((host, Outcome::Ignored("its generation is no longer kept")));
    };
    let failing = plugins::failing(&report.logs, &manifest);
    let names: Vec<String> = failing.iter().map(|(n, _)| n.clone()).collect();
    if !state
        .fleet
        .heard_puppet_run(&host, &env, generation, &names)
    {
        return Ok((host, Outcome::Ignored("served another generation since")));
    }
    Ok((host, Outcome::Recorded(failing)))
}

/// The manifest of `generation`, if `env` keeps it.
fn manifest(state: &AppState, env: &EnvName, generation: &GenerationId) -> Option<Manifest> {
    match state.store.generations.manifest(env, generation) {
        Ok(Some(bytes)) => Manifest::parse(&bytes, generation).ok(),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(environment = %env, error = %e, "generation manifest unreadable");
            None
        }
    }
}
