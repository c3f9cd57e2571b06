//! The one retry policy (docs/protocol.md §4.7): up to `retries` attempts
//! at a server, capped exponential backoff with full jitter between them
//! or the server's `Retry-After`, never past the run's deadline. Batches
//! retry at one server ([`Retry::retrying`]); listings, node requests and
//! downloads move between servers (`servers.rs`) but wait the same
//! [`Retry::backoff`].

use std::time::{Duration, Instant};

use super::error::{FetchError, Transient, Unreached};

/// What one attempt says about retrying.
#[derive(Debug)]
pub enum Attempt<T> {
    /// It succeeded.
    Done(T),
    /// It failed for good: no other attempt.
    Fatal(FetchError),
    /// It failed; another attempt may do better.
    Retry {
        /// What happened.
        error: Transient,
        /// The server's `Retry-After`, if it said.
        after: Option<Duration>,
    },
}

impl<T> Attempt<T> {
    /// A request that failed before an answer: worth another attempt.
    pub fn transient(e: &reqwest::Error) -> Attempt<T> {
        Attempt::Retry {
            error: Transient::of(e),
            after: None,
        }
    }
}

/// How often and until when requests are retried.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    retries: u32,
    deadline: Instant,
}

impl Retry {
    /// `retries` attempts per server (at least one), all before `deadline`.
    pub fn new(retries: u32, deadline: Instant) -> Retry {
        Retry {
            retries: retries.max(1),
            deadline,
        }
    }

    /// Attempts per server.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// The time left before the run's deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Up to `retries` attempts at `server`, waiting in between
    /// ([`Retry::backoff`]), never past the run's deadline. When the
    /// attempts or the time run out, the server is
    /// [`FetchError::Unreachable`], with why.
    pub async fn retrying<T>(
        &self,
        server: &str,
        what: &str,
        mut attempt: impl AsyncFnMut() -> Attempt<T>,
    ) -> Result<T, FetchError> {
        let give_up = |detail| FetchError::Unreachable {
            servers: server.to_owned(),
            detail,
        };
        let mut last = None;
        for n in 0..self.retries {
            if self.remaining().is_zero() {
                return Err(give_up(Unreached::Deadline(last)));
            }
            match attempt().await {
                Attempt::Done(v) => return Ok(v),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Retry { error, after } => {
                    tracing::info!(server = %server, what = %what, attempt = n + 1, error = %error, "request failed");
                    if n + 1 < self.retries {
                        self.backoff(n, after).await;
                    }
                    last = Some(error);
                }
            }
        }
        Err(give_up(match last {
            Some(error) => Unreached::Failed(error),
            None => Unreached::Deadline(None),
        }))
    }

    /// Waits before attempt `n + 1` (capped exponential backoff with full
    /// jitter, or the server's `Retry-After`), within the deadline.
    pub async fn backoff(&self, n: u32, after: Option<Duration>) {
        let cap = Duration::from_millis(200 * (1u64 << n.min(5))).min(Duration::from_secs(5));
        let wait = after.unwrap_or_else(|| cap.mul_f64(rand::random::<f64>()));
        tokio::time::sleep(wait.min(self.remaining())).await;
    }
}
