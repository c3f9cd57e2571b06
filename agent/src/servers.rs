//! Which master answers: the run's origin, the failover order, and the
//! replicas that proved they serve the same listing (docs/protocol.md
//! §4.7). Every request itself is `client.rs`'s; this module only says
//! where it goes.
//!
//! - The listing phase (the node request, the first listing) asks the
//!   servers of `servers` in order, one attempt at a time, until one
//!   answers (`failover`); the one that answers the first listing
//!   is the run's [`Origin`] and answers every later listing of the run —
//!   unless it fails, and then a replica that answers `304` to every
//!   listing the run already holds (the same view of the environment)
//!   takes over as the origin. A master that refuses connections is asked
//!   again: for [`FIRST_CONTACT_GRACE`] until the run has its origin, until
//!   the run's deadline after.
//! - Downloads fail over: content is addressed by sha256 and verified as
//!   it streams, so any replica serving the *same listing* may serve it —
//!   a replica is used only once it answered `304 Not Modified` to the
//!   listing's own `ETag` (asked once per server and mount, `Replicas`),
//!   and a master that refuses connections (restarting) is waited for
//!   until the deadline ([`Servers::download`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use pluginsync_common::digest::Sha256;
use pluginsync_common::envname::EnvName;
use pluginsync_common::etag::ETag;
use pluginsync_common::protocol::{ListingQuery, Mount};

use crate::client::{
    self, Attempt, Body, Client, FetchError, FileWanted, ListingAnswer, Offers, Retry, Revalidated,
    Transient, Unreached,
};

mod download;
mod generation;

/// How long a request of the listing phase asks again a server that
/// refuses connections until the run has its origin (the first listing
/// answered): a master restarting comes back within seconds, while a
/// server that has not answered yet may as well be misconfigured, and a
/// timer-driven run should not spend its whole `timeout` on a typo
/// (docs/protocol.md §4.7). Once the run has its origin, a refusal is
/// waited for until the run's deadline.
pub const FIRST_CONTACT_GRACE: Duration = Duration::from_secs(10);

/// A master and what it offers beyond Puppet's API (docs/protocol.md §7).
/// The run's origin is the master that answered its first listing: every
/// listing of the run comes from it, and content too unless it fails and a
/// replica serving the same listing takes over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `https://host:port`, as configured.
    pub server: String,
    /// What its answer offered.
    pub offers: Offers,
}

impl Origin {
    /// Whether it serves batches of blobs.
    pub fn serves_batches(&self) -> bool {
        self.offers.batch.is_some()
    }
}

/// Where one resource's content comes from: the origin its listing came
/// from, the mount, the environment, and the listing it was planned from,
/// which a replica must be serving too before it may serve the content.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The run's master.
    pub origin: &'a Origin,
    /// `plugins` or `pluginfacts`.
    pub mount: Mount,
    /// The environment.
    pub env: &'a EnvName,
    /// The listing's query string ([`ListingQuery::to_query`]).
    pub query: &'a str,
    /// The listing's `ETag`. Without one (Puppet Server sends none) no
    /// replica can be shown to serve the same listing, and content comes
    /// from the origin only.
    pub etag: Option<&'a ETag>,
    /// A generation's content (docs/protocol.md §7.6): asked by digest
    /// only and verified against the generation's manifest, so any
    /// server may serve it; one that does not keep it answers 404 and the
    /// next is asked.
    pub by_digest: bool,
}

/// A listing the run holds: a replica must answer its query with its
/// `ETag` (`304`) before it may serve the run's later listings.
#[derive(Debug)]
struct Listed {
    mount: Mount,
    /// [`ListingQuery::to_query`].
    query: String,
    /// Without one, no replica can be shown to serve the same listing.
    etag: Option<ETag>,
}

/// What the run knows of the replicas, shared by every download.
#[derive(Debug, Default)]
struct Replicas {
    /// `(server, mount, listing ETag)` → the server's offers when it
    /// serves that very listing (it answered 304 to the ETag), `None` when
    /// it serves another. Absent: not asked yet, or it could not be asked.
    verdicts: HashMap<(String, Mount, ETag), Option<Offers>>,
    /// Per mount, the server the next download starts at: the last one
    /// that delivered (the origin until one failed).
    preferred: HashMap<Mount, String>,
    /// The servers that served bytes not matching their digest in this
    /// run (warned of once each).
    bad_content: HashSet<String>,
}

/// Which replica a download's next attempt goes to.
enum Pick {
    /// This one.
    Use(Origin),
    /// None now, but a replica that could not be asked may be later.
    Wait,
    /// None: every replica failed for good or serves another listing.
    GiveUp,
}

/// The configured servers, in failover order, and what the run learnt of
/// them.
#[derive(Debug)]
pub struct Servers {
    client: Client,
    list: Vec<String>,
    /// The master serving the run, once one answered the first listing.
    origin: Option<Origin>,
    /// The listings the run holds, one per mount.
    listed: Vec<Listed>,
    replicas: tokio::sync::Mutex<Replicas>,
    /// The server whose per-node answer said, in this run, that it serves
    /// no generations ([`Servers::unassigned`]).
    unassigned: Option<String>,
}

impl Servers {
    /// `list` (`servers`, in failover order), asked through `client`.
    pub fn new(client: Client, list: Vec<String>) -> Servers {
        Servers {
            client,
            list,
            origin: None,
            listed: Vec::new(),
            replicas: Default::default(),
            unassigned: None,
        }
    }

    /// The HTTP client of every request (`trust::MasterTransport`'s too).
    pub fn http(&self) -> reqwest::Client {
        self.client.http()
    }

    /// The server whose per-node answer said, in this run, that it serves
    /// no generations (a 404 from a stock Puppet Server, or from Puppet
    /// Server behind a balancer that does not route `/pluginsync/v1/`).
    pub fn unassigned(&self) -> Option<&str> {
        self.unassigned.as_deref()
    }

    /// Until when a refusing server is asked again by a request of the
    /// listing phase: the run's deadline once the run has its origin (a
    /// master that refuses now is restarting), else at most
    /// [`FIRST_CONTACT_GRACE`] from now.
    fn refused_until(&self) -> Instant {
        let deadline = Instant::now() + self.client.retry().remaining();
        match self.origin {
            Some(_) => deadline,
            None => deadline.min(Instant::now() + FIRST_CONTACT_GRACE),
        }
    }

    /// The listing of `mount`: the run's first comes from the first server
    /// that answers, which becomes the run's origin; every later one from
    /// the origin or, when it fails, from a replica shown to serve every
    /// listing the run holds for the other mounts, which then becomes the
    /// origin ([`Servers::same_view`]). `if_none_match` gives the
    /// `If-None-Match` for a server.
    pub async fn listing(
        &mut self,
        mount: Mount,
        query: &ListingQuery<'_>,
        if_none_match: &dyn Fn(&str) -> Option<ETag>,
    ) -> Result<(Origin, ListingAnswer), FetchError> {
        let ring = self.ring();
        let answered = failover(
            self.client.retry(),
            "server unavailable, trying the next one",
            &ring,
            self.refused_until(),
            async |server| self.same_view(server, mount).await,
            async |server| {
                let inm = if_none_match(server);
                self.client
                    .listing(server, mount, query, inm.as_ref())
                    .await
            },
        )
        .await;
        let (server, (offers, answer)) = self.explained(answered).await?;
        if let Some(previous) = self.origin.as_ref().filter(|o| o.server != server) {
            tracing::info!(server = %server, previous = %previous.server, mount = %mount, "listing from a replica serving the same listings");
        }
        let origin = Origin { server, offers };
        self.origin = Some(origin.clone());
        self.listed.retain(|l| l.mount != mount);
        self.listed.push(Listed {
            mount,
            query: query.to_query(),
            etag: answer.etag().cloned(),
        });
        Ok((origin, answer))
    }

    /// The servers a request of the listing phase asks, in order: from
    /// the origin (wrapping around) once there is one, else `servers`.
    fn ring(&self) -> Vec<&str> {
        match &self.origin {
            Some(origin) => ring(&self.list, &origin.server),
            None => self.list.iter().map(String::as_str).collect(),
        }
    }

    /// What a first contact's `failover` got, with a closed connection
    /// explained while the run has no origin yet ([`Servers::explain`]).
    async fn explained<T>(
        &self,
        answered: Result<(String, T), FetchError>,
    ) -> Result<(String, T), FetchError> {
        match answered {
            Err(FetchError::Unreachable { servers, detail }) if self.origin.is_none() => {
                let detail = self.explain(detail).await;
                Err(FetchError::Unreachable { servers, detail })
            }
            other => other,
        }
    }

    /// Whether `server` may answer a listing of `mount` in this run: the
    /// origin (or any server, before there is one) may; another server
    /// only once it answered `304` to every listing the run holds for the
    /// other mounts (`Servers::verdict`), so that the run's listings are
    /// one master's view (docs/protocol.md §4.7). `None`: it could not be
    /// asked now.
    async fn same_view(&self, server: &str, mount: Mount) -> Option<bool> {
        if self.origin.as_ref().is_none_or(|o| o.server == server) {
            return Some(true);
        }
        for l in self.listed.iter().filter(|l| l.mount != mount) {
            let Some(etag) = &l.etag else {
                return Some(false);
            };
            match self.verdict(server, l.mount, &l.query, etag).await {
                Some(Some(_)) => {}
                Some(None) => return Some(false),
                None => return None,
            }
        }
        Some(true)
    }

    /// A closed connection may be a refused client certificate (TLS 1.3
    /// alerts come after the handshake): asks the last server once more,
    /// plainly, why.
    async fn explain(&self, last: Unreached) -> Unreached {
        if last.refused_or_timed_out() {
            return last;
        }
        let Some(server) = self.list.last() else {
            return last;
        };
        match self.client.explain(server).await {
            Some(cause) => Unreached::Explained(cause),
            None => last,
        }
    }

    /// The environment the node classifier of the first server that
    /// answers assigns to `certname` (docs/protocol.md §4.10); `None` when
    /// that server does not serve the node endpoint.
    pub async fn node_environment(
        &self,
        certname: &str,
        configured: &EnvName,
    ) -> Result<Option<EnvName>, FetchError> {
        let uuid = client::transaction_uuid();
        let log = "server unavailable for the node request, trying the next one";
        let ring: Vec<&str> = self.list.iter().map(String::as_str).collect();
        let asked = failover(
            self.client.retry(),
            log,
            &ring,
            self.refused_until(),
            async |_| Some(true),
            async |server| {
                self.client
                    .node_environment(server, certname, configured, &uuid)
                    .await
            },
        )
        .await;
        asked.map(|(_, env)| env)
    }

    /// Asks the batch endpoint of the replica that serves `src` now (the
    /// origin until a download failed over) for `hashes`; returns the body
    /// to read frame by frame. `None` when that replica serves no batches.
    pub async fn batch(
        &self,
        src: &Source<'_>,
        hashes: &[Sha256],
    ) -> Option<Result<Body, FetchError>> {
        let replica = match self.pick(src, None, &HashSet::new()).await {
            Pick::Use(r) => r,
            Pick::Wait | Pick::GiveUp => src.origin.clone(),
        };
        let path = replica.offers.batch.as_ref()?;
        let what = format!("a batch of {} {} files", hashes.len(), src.mount);
        Some(
            self.client
                .batch(&replica.server, path, src.env, &what, hashes)
                .await,
        )
    }

    /// The replica for `src`'s next attempt: the servers in order from the
    /// one after `after` (a first attempt: from the preferred one), minus
    /// `exhausted`; the origin is always eligible, any other server only
    /// once it showed that it serves the same listing.
    async fn pick(
        &self,
        src: &Source<'_>,
        after: Option<&str>,
        exhausted: &HashSet<String>,
    ) -> Pick {
        let ring = ring(&self.list, &src.origin.server);
        let start = match after {
            Some(s) => ring.iter().position(|r| *r == s).map_or(0, |i| i + 1),
            None => {
                let replicas = self.replicas.lock().await;
                let preferred = replicas.preferred.get(&src.mount);
                preferred
                    .and_then(|p| ring.iter().position(|r| r == p))
                    .unwrap_or(0)
            }
        };
        let mut unknown = false;
        for k in 0..ring.len() {
            let server = ring[(start + k) % ring.len()];
            if exhausted.contains(server) {
                continue;
            }
            if server == src.origin.server {
                return Pick::Use(src.origin.clone());
            }
            if src.by_digest {
                let (server, offers) = (server.to_owned(), src.origin.offers.clone());
                return Pick::Use(Origin { server, offers });
            }
            let Some(etag) = src.etag else { continue };
            match self.verdict(server, src.mount, src.query, etag).await {
                Some(Some(offers)) => {
                    let server = server.to_owned();
                    return Pick::Use(Origin { server, offers });
                }
                Some(None) => {}
                None => unknown = true,
            }
        }
        if unknown { Pick::Wait } else { Pick::GiveUp }
    }

    /// Whether `server` serves the listing of `mount` for `query` that
    /// `etag` names: asked once per run, mount and listing
    /// (`Client::revalidate`), and remembered unless it could not be
    /// asked. `Some(None)`: it serves another listing; `None`: it could not
    /// be asked now.
    async fn verdict(
        &self,
        server: &str,
        mount: Mount,
        query: &str,
        etag: &ETag,
    ) -> Option<Option<Offers>> {
        let key = (server.to_owned(), mount, etag.clone());
        // Held while asking, so that parallel downloads ask once.
        let mut replicas = self.replicas.lock().await;
        if let Some(v) = replicas.verdicts.get(&key) {
            return Some(v.clone());
        }
        let verdict = match self.client.revalidate(server, mount, query, etag).await {
            Revalidated::Same(offers) => {
                tracing::info!(server = %server, mount = %mount, "replica serves the same listing");
                Some(offers)
            }
            Revalidated::Other => {
                tracing::info!(server = %server, mount = %mount, "replica serves another listing; not used");
                None
            }
            Revalidated::Unknown => return None,
        };
        replicas.verdicts.insert(key, verdict.clone());
        Some(verdict)
    }

    /// `server` delivered: the next downloads of `mount` start there.
    async fn prefer(&self, mount: Mount, server: &str) {
        let mut replicas = self.replicas.lock().await;
        if replicas.preferred.get(&mount).map(String::as_str) != Some(server) {
            replicas.preferred.insert(mount, server.to_owned());
        }
    }

    /// `server` failed: if the next downloads of `src`'s mount would start
    /// there, they start at the server after it instead.
    async fn avoid(&self, src: &Source<'_>, server: &str) {
        let ring = ring(&self.list, &src.origin.server);
        let mut replicas = self.replicas.lock().await;
        let current = replicas
            .preferred
            .get(&src.mount)
            .map_or(src.origin.server.as_str(), String::as_str);
        if current == server
            && let Some(i) = ring.iter().position(|r| *r == server)
        {
            let next = ring[(i + 1) % ring.len()].to_owned();
            replicas.preferred.insert(src.mount, next);
        }
    }
}

/// Asks `ask` of the servers of `ring`, one attempt at a time, until
/// one answers (docs/protocol.md §4.7): a transient failure moves on to
/// the next server, a round without an answer waits the backoff
/// (`Retry::backoff`) before the next. A server that *answered* and
/// failed `retries` times drops out (`log` says so); one that refuses
/// connections (a master restarting) is asked again until
/// `refused_until` (at most the run's deadline). `admit` says whether a
/// server may be asked at all (`None`: not now, perhaps later). Any
/// other error is the master's final word (404 environment, 403, 400)
/// and does not fail over. `retry` gives the attempts per server, the
/// backoff and the deadline.
async fn failover<T>(
    retry: &Retry,
    log: &str,
    ring: &[&str],
    refused_until: Instant,
    admit: impl AsyncFn(&str) -> Option<bool>,
    mut ask: impl AsyncFnMut(&str) -> Attempt<T>,
) -> Result<(String, T), FetchError> {
    let mut failures: HashMap<&str, u32> = HashMap::new();
    let mut out: HashSet<&str> = HashSet::new();
    let mut last: Option<Transient> = None;
    let give_up = |detail| FetchError::Unreachable {
        servers: ring.join(", "),
        detail,
    };
    for round in 0u32.. {
        let (mut asked, mut later, mut after) = (false, false, None);
        for &server in ring {
            if retry.remaining().is_zero() {
                return Err(give_up(Unreached::Deadline(last)));
            }
            if out.contains(server) {
                continue;
            }
            match admit(server).await {
                Some(true) => {}
                Some(false) => {
                    out.insert(server);
                    continue;
                }
                None => {
                    later = true;
                    continue;
                }
            }
            asked = true;
            let error = match ask(server).await {
                Attempt::Done(v) => return Ok((server.to_owned(), v)),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry { error, after: a } => {
                    after = a.or(after);
                    error
                }
            };
            let n = failures.entry(server).or_default();
            *n += 1;
            tracing::info!(server = %server, attempt = *n, error = %error, "request failed");
            let spent = match error.reached() {
                true => *n >= retry.retries(),
                false => Instant::now() >= refused_until,
            };
            if spent {
                tracing::info!(server = %server, error = %error, "{log}");
                out.insert(server);
            }
            last = Some(error);
        }
        if !asked && !later {
            return Err(give_up(last.map_or(Unreached::NoServer, Unreached::Failed)));
        }
        retry.backoff(round, after).await;
    }
    unreachable!("the rounds loop returns")
}

/// The replicas in the order downloads try them: the `origin`, then the
/// servers after it in `servers`, wrapping around.
fn ring<'a>(servers: &'a [String], origin: &'a str) -> Vec<&'a str> {
    let servers: Vec<&str> = servers.iter().map(String::as_str).collect();
    match servers.iter().position(|s| *s == origin) {
        Some(i) => servers[i..].iter().chain(&servers[..i]).copied().collect(),
        None => std::iter::once(origin).chain(servers).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downloads_try_the_origin_then_the_servers_after_it() {
        let servers: Vec<String> = ["https://a", "https://b", "https://c"]
            .map(str::to_owned)
            .to_vec();
        assert_eq!(
            ring(&servers, "https://b"),
            ["https://b", "https://c", "https://a"]
        );
        // `--server` lists may not name the origin (never in practice).
        assert_eq!(
            ring(&servers, "https://x"),
            ["https://x", "https://a", "https://b", "https://c"]
        );
    }

    fn refused() -> Attempt<&'static str> {
        Attempt::Retry {
            error: Transient::Refused("Connection refused".into()),
            after: None,
        }
    }

    fn reset() -> Attempt<&'static str> {
        Attempt::Retry {
            error: Transient::Connect("Connection reset by peer".into()),
            after: None,
        }
    }

    fn in_ms(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    /// `failover` over `ring` with `ask` answering per server, every
    /// server admitted; what it returned and whom it asked, in order.
    async fn ask_around(
        retry: &Retry,
        ring: &[&str],
        refused_until: Instant,
        answer: impl Fn(&str, usize) -> Attempt<&'static str>,
    ) -> (Result<(String, &'static str), FetchError>, Vec<String>) {
        let mut asked = Vec::new();
        let got = failover(
            retry,
            "next",
            ring,
            refused_until,
            async |_| Some(true),
            async |s| {
                asked.push(s.to_owned());
                answer(s, asked.len())
            },
        )
        .await;
        (got, asked)
    }

    #[tokio::test]
    async fn a_failure_moves_on_to_the_next_server_at_once() {
        let retry = Retry::new(3, in_ms(10_000));
        let (got, asked) = ask_around(&retry, &["a", "b"], in_ms(10_000), |s, _| match s {
            "a" => reset(),
            _ => Attempt::Done("listing"),
        })
        .await;
        assert_eq!(got.unwrap(), ("b".to_owned(), "listing"));
        assert_eq!(asked, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_refusing_server_is_asked_again_until_it_answers() {
        // A master restarting: refuses three times, then answers; the
        // answered failures of another server are counted against it only.
        let retry = Retry::new(2, in_ms(10_000));
        let (got, asked) = ask_around(&retry, &["a", "b"], in_ms(10_000), |s, n| match (s, n) {
            ("a", n) if n < 6 => refused(),
            ("a", _) => Attempt::Done("listing"),
            _ => reset(),
        })
        .await;
        assert_eq!(got.unwrap(), ("a".to_owned(), "listing"));
        // b answered badly twice (`retries`) and dropped out.
        assert_eq!(asked, ["a", "b", "a", "b", "a", "a"]);
    }

    #[tokio::test]
    async fn a_refusing_server_drops_out_once_its_wait_is_over() {
        let retry = Retry::new(2, in_ms(10_000));
        let started = Instant::now();
        let (got, asked) = ask_around(&retry, &["a"], in_ms(300), |_, _| refused()).await;
        let e = got.unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot reach a: connection failed: Connection refused"
        );
        assert!(asked.len() >= 2, "{asked:?}");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn servers_that_answered_badly_give_up_after_their_attempts() {
        let retry = Retry::new(2, in_ms(10_000));
        let (got, asked) = ask_around(&retry, &["a", "b"], in_ms(10_000), |_, _| reset()).await;
        assert_eq!(
            got.unwrap_err().to_string(),
            "cannot reach a, b: connection failed: Connection reset by peer"
        );
        assert_eq!(asked, ["a", "b", "a", "b"]);
    }

    #[tokio::test]
    async fn a_final_answer_does_not_fail_over() {
        let retry = Retry::new(3, in_ms(10_000));
        let (got, asked) = ask_around(&retry, &["a", "b"], in_ms(10_000), |_, _| {
            Attempt::Fatal(FetchError::EnvironmentNotFound {
                env: "nope".into(),
                server: "a".into(),
            })
        })
        .await;
        assert!(matches!(got, Err(FetchError::EnvironmentNotFound { .. })));
        assert_eq!(asked, ["a"]);
    }

    #[tokio::test]
    async fn only_admitted_servers_are_asked_and_the_deadline_ends_the_wait() {
        // b serves another view (never asked); c cannot be asked now, so
        // the refusing a is waited for until the deadline.
        let retry = Retry::new(2, in_ms(400));
        let mut asked = Vec::new();
        let admit = async |s: &str| match s {
            "b" => Some(false),
            "c" => None,
            _ => Some(true),
        };
        let got = failover(
            &retry,
            "next",
            &["a", "b", "c"],
            in_ms(10_000),
            admit,
            async |s| {
                asked.push(s.to_owned());
                refused()
            },
        )
        .await;
        assert_eq!(
            got.unwrap_err().to_string(),
            "cannot reach a, b, c: run deadline reached (connection failed: Connection refused)"
        );
        assert!(
            asked.iter().all(|s| s == "a") && asked.len() >= 2,
            "{asked:?}"
        );
    }
}
