//! What went wrong with a request, as values: the caller matches on what
//! happened (a status and its code, a timeout, a refused connection, a TLS
//! failure, a cut or malformed body, an answer too large), never on text.
//! The `Display` of each is the one line the run reports.

use std::path::PathBuf;

use pluginsync_common::protocol::Mount;
use pluginsync_common::tls::TlsError;
use reqwest::StatusCode;

use crate::config::ConfigError;

/// A request that did not produce what was asked; one line each.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No server could be reached (or kept failing) before the deadline.
    #[error("cannot reach {servers}: {detail}")]
    Unreachable {
        /// The servers tried.
        servers: String,
        /// The last failure.
        detail: Unreached,
    },
    /// The environment does not exist on the master.
    #[error("environment '{env}' not found on {server}")]
    EnvironmentNotFound {
        /// The environment.
        env: String,
        /// The server.
        server: String,
    },
    /// A non-2xx answer that retrying will not fix.
    #[error(transparent)]
    Status(Answered),
    /// A 2xx answer that is not a listing.
    #[error("malformed listing from {server}: {detail}")]
    Malformed {
        /// The server.
        server: String,
        /// What is wrong, in the JSON parser's words.
        detail: serde_json::Error,
    },
    /// A listing larger than the agent reads (`MAX_LISTING_BYTES`) once
    /// inflated.
    #[error(
        "malformed listing from {server}: the {mount} listing is larger than {} MiB (inflated); refused",
        limit >> 20
    )]
    ListingTooLarge {
        /// The server.
        server: String,
        /// The listing's mount.
        mount: Mount,
        /// The limit, in bytes.
        limit: usize,
    },
    /// A 2xx answer to the node request that does not name an environment
    /// this agent can sync.
    #[error("{server} answered 200 OK for the node: {problem}")]
    Node {
        /// The server.
        server: String,
        /// What is wrong with it.
        problem: NodeProblem,
    },
    /// A 2xx answer to a generation request (docs/protocol.md §7.6) that
    /// is refused.
    #[error("{server} answered 200 OK for {what}: {detail}")]
    Generation {
        /// The server.
        server: String,
        /// What was asked.
        what: String,
        /// What is wrong with it.
        detail: GenerationProblem,
    },
    /// A download that failed, did not match its checksum, or could not be
    /// staged.
    #[error("download of {what} from {server} failed: {detail}")]
    Download {
        /// The server.
        server: String,
        /// Mount and path.
        what: String,
        /// What happened.
        detail: Undelivered,
    },
}

/// A master's answer that is not a success.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{server} answered {status} for {what}: {message}")]
pub struct Answered {
    /// The server.
    pub server: String,
    /// The status.
    pub status: StatusCode,
    /// What was asked.
    pub what: String,
    /// The server's message.
    pub message: String,
}

/// Why a node object was not used.
#[derive(Debug, thiserror::Error)]
pub enum NodeProblem {
    /// Not JSON with an `environment`.
    #[error("not a node object: {0}")]
    NotNode(#[source] serde_json::Error),
    /// Larger than the agent reads (`MAX_NODE_BYTES`).
    #[error("the node object is larger than {} KiB; refused", .0 >> 10)]
    TooLarge(usize),
    /// The environment it assigns is not a valid name.
    #[error("assigned {0}")]
    Assigned(#[source] ConfigError),
}

/// Why no server gave an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unreached {
    /// The server list is empty.
    #[error("no server configured")]
    NoServer,
    /// The run's deadline came first; the last failure before it, if any.
    #[error("run deadline reached ({})", last_words(.0.as_ref()))]
    Deadline(Option<Transient>),
    /// The attempts ran out; the last failure.
    #[error(transparent)]
    Failed(Transient),
    /// What a plain TLS probe found after a closed connection
    /// (`certs::probe`): the handshake's alert, in words.
    #[error("{0}")]
    Explained(String),
}

impl Unreached {
    /// Whether nothing listened or nothing answered in time: then a TLS
    /// probe has nothing to explain.
    pub fn refused_or_timed_out(&self) -> bool {
        matches!(
            self,
            Unreached::Failed(Transient::Refused(_) | Transient::Timeout)
                | Unreached::Deadline(Some(Transient::Refused(_)))
        )
    }
}

fn last_words(t: Option<&Transient>) -> String {
    t.map(ToString::to_string).unwrap_or_default()
}

/// Why a download was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum Undelivered {
    /// The body's consumer refused it (the staged file cannot be written,
    /// a batch frame that was not asked for).
    #[error("{0}")]
    Rejected(String),
    /// The bytes do not match the digest asked for: the server served bad
    /// content (`Servers::download` asks the next one).
    #[error("{0}")]
    Mismatch(String),
    /// The last failure of the last replica tried.
    #[error(transparent)]
    Failed(Box<Transient>),
    /// Every replica failed for good or serves another listing.
    #[error("no replica left")]
    NoReplica,
    /// The run's deadline came first.
    #[error("run deadline reached: {0}")]
    Deadline(Box<Undelivered>),
}

/// A failure another attempt may not repeat.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Transient {
    /// No answer in time.
    #[error("timed out")]
    Timeout,
    /// Nothing listens on the port (a master down or restarting); the
    /// innermost cause.
    #[error("connection failed: {0}")]
    Refused(String),
    /// The connection failed otherwise (reset, unreachable); the innermost
    /// cause.
    #[error("connection failed: {0}")]
    Connect(String),
    /// The TLS handshake failed, in words (`certs::explain`).
    #[error("{0}")]
    Tls(String),
    /// Anything else the HTTP stack reports, without the URL.
    #[error("{0}")]
    Other(String),
    /// A `5xx` or `429` answer.
    #[error(transparent)]
    Status(Answered),
    /// The body broke off.
    #[error("transfer cut after {received} bytes: {cause}")]
    Cut {
        /// Bytes received before.
        received: u64,
        /// Why it broke off.
        cause: Box<Transient>,
    },
}

impl Transient {
    /// What a request error was.
    pub fn of(e: &reqwest::Error) -> Transient {
        if let Some(cause) = crate::certs::explain(e) {
            return Transient::Tls(cause);
        }
        if e.is_timeout() {
            return Transient::Timeout;
        }
        if e.is_connect() {
            let mut inner: &dyn std::error::Error = e;
            while let Some(next) = inner.source() {
                inner = next;
            }
            return if refused(e) {
                Transient::Refused(inner.to_string())
            } else {
                Transient::Connect(inner.to_string())
            };
        }
        let mut text = e.to_string();
        if let Some(u) = e.url() {
            text = text.replace(&format!(" for url ({u})"), "");
        }
        let mut cur = std::error::Error::source(e);
        while let Some(c) = cur {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cur = c.source();
        }
        Transient::Other(text)
    }

    /// Whether the server was there at all: `false` only for a refused
    /// connection (nothing listens: a master that is restarting).
    pub fn reached(&self) -> bool {
        !matches!(self, Transient::Refused(_))
    }
}

/// Whether `e` is a refused connection: nothing listens on the port (a
/// master that is down or restarting), as opposed to one that answered
/// badly.
pub fn refused(e: &reqwest::Error) -> bool {
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The client could not be set up; only `Client::new` says this.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A TLS file could not be read.
    #[error(transparent)]
    Read(#[from] TlsError),
    /// The CA bundle or the CRL was read but the TLS stack refused it.
    #[error("{what} '{}': {detail}", path.display())]
    Unusable {
        /// `CA bundle` or `CRL`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The TLS stack's reason, on one line.
        detail: String,
    },
    /// The certificate and key were read but do not make an identity.
    #[error("certificate '{}' and key '{}': {detail}", cert.display(), key.display())]
    Identity {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// The TLS stack's reason, on one line.
        detail: String,
    },
    /// The HTTP client could not be built.
    #[error("TLS client: {0}")]
    Build(String),
    /// This node's certificate is expired or not yet valid.
    #[error(transparent)]
    Certificate(#[from] crate::certs::Unusable),
}

/// A 2xx answer of the generation requests that is refused.
#[derive(Debug, thiserror::Error)]
pub enum GenerationProblem {
    /// It names another environment than the one asked for.
    #[error("it names environment '{0}', not the one asked for")]
    OtherEnvironment(String),
    /// Larger than the agent reads.
    #[error("larger than {} MiB; refused", .0 >> 20)]
    TooLarge(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_reads_as_the_line_the_report_has_always_had() {
        let s = || "https://m:8140".to_owned();
        let cases: [(Box<dyn std::error::Error>, &str); 8] = [
            (
                Box::new(FetchError::ListingTooLarge {
                    server: s(),
                    mount: Mount::Plugins,
                    limit: 256 << 20,
                }),
                "malformed listing from https://m:8140: the plugins listing is larger than 256 MiB (inflated); refused",
            ),
            (
                Box::new(FetchError::Node {
                    server: s(),
                    problem: NodeProblem::TooLarge(1 << 20),
                }),
                "https://m:8140 answered 200 OK for the node: the node object is larger than 1024 KiB; refused",
            ),
            (
                Box::new(FetchError::Status(Answered {
                    server: s(),
                    status: StatusCode::NOT_FOUND,
                    what: "plugins/a.rb".into(),
                    message: "gone".into(),
                })),
                "https://m:8140 answered 404 Not Found for plugins/a.rb: gone",
            ),
            (
                Box::new(FetchError::Unreachable {
                    servers: s(),
                    detail: Unreached::Deadline(None),
                }),
                "cannot reach https://m:8140: run deadline reached ()",
            ),
            (
                Box::new(Unreached::Deadline(Some(Transient::Timeout))),
                "run deadline reached (timed out)",
            ),
            (
                Box::new(FetchError::Download {
                    server: s(),
                    what: "plugins/a.rb".into(),
                    detail: Undelivered::Deadline(Box::new(Undelivered::NoReplica)),
                }),
                "download of plugins/a.rb from https://m:8140 failed: run deadline reached: no replica left",
            ),
            (
                Box::new(Transient::Cut {
                    received: 5,
                    cause: Box::new(Transient::Refused(
                        "Connection refused (os error 111)".into(),
                    )),
                }),
                "transfer cut after 5 bytes: connection failed: Connection refused (os error 111)",
            ),
            (Box::new(Unreached::NoServer), "no server configured"),
        ];
        for (e, line) in cases {
            assert_eq!(e.to_string(), line);
        }
    }

    #[test]
    fn a_probe_is_only_for_a_server_that_was_there() {
        let refused = Transient::Refused("Connection refused (os error 111)".into());
        assert!(!refused.reached());
        assert!(Transient::Timeout.reached());
        for quiet in [
            Unreached::Failed(refused.clone()),
            Unreached::Failed(Transient::Timeout),
            Unreached::Deadline(Some(refused)),
        ] {
            assert!(quiet.refused_or_timed_out(), "{quiet}");
        }
        for closed in [
            Unreached::Failed(Transient::Other("connection closed".into())),
            Unreached::Deadline(Some(Transient::Timeout)),
            Unreached::Deadline(None),
        ] {
            assert!(!closed.refused_or_timed_out(), "{closed}");
        }
    }
}
