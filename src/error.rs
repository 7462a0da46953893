//! The one error type of fencelock.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use crate::{FencingToken, LostReason, SessionEnd};

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used throughout fencelock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in fencelock.
///
/// Use [`Error::is_temporary`] to decide whether a retry may succeed. An error's `Display` says
/// what failed; the underlying client error, if any, is its [`source`](std::error::Error::source)
/// (print the chain, as `anyhow` and `tracing` do, to see both).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lock, election or namespace name was rejected.
    #[error("invalid name {}", .0)]
    InvalidName(InvalidInput),
    /// A session TTL or safety margin was rejected.
    #[error("invalid ttl {}", .0)]
    InvalidTtl(InvalidInput),
    /// An entry value (an election candidate's published value) was rejected, for example
    /// because it is longer than the backend's limit.
    #[error("invalid value {}", .0)]
    InvalidValue(InvalidInput),
    /// Another setting (an endpoint, a timeout, a certificate, a chroot) was rejected.
    #[error("invalid configuration {}", .0)]
    InvalidConfig(InvalidInput),
    /// The backend could not be reached, or refused the connection.
    #[error("{backend}: cannot connect to {endpoints}")]
    Connect {
        /// Backend tag (`"etcd"`, `"zookeeper"`, `"redis"`, `"memory"`).
        backend: &'static str,
        /// The endpoints that were tried.
        endpoints: String,
        /// Whether trying again may succeed (the cluster was unreachable, rather than a TLS,
        /// authentication or configuration failure).
        temporary: bool,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The cluster refused our credentials (a wrong password, an unknown user, a failed SASL
    /// or TLS client authentication). Permanent.
    #[error("{backend}: authentication failed")]
    Unauthenticated {
        /// Backend tag.
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The cluster refused an operation for lack of permission on a key or node (an etcd role
    /// without access to the namespace, a ZooKeeper ACL). Permanent.
    #[error("{backend}: permission denied for {op}")]
    PermissionDenied {
        /// Backend tag.
        backend: &'static str,
        /// The operation that was refused.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The cluster refused to store more: it is at its memory or space limit (a Redis server at
    /// `maxmemory` under `noeviction`, an etcd cluster past its space quota). New entries and
    /// sessions are refused; what exists lives on (heartbeats and releases still run). Not
    /// temporary: an operator must make room (raise the limit; on etcd, compact, defragment
    /// and disarm the alarm), so a wait does not retry it for as long as its session lives.
    #[error("{backend}: {op} refused: the cluster is out of space")]
    OutOfSpace {
        /// Backend tag.
        backend: &'static str,
        /// The operation that was refused.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// An operation did not finish within its deadline (for example
    /// [`Mutex::lock_timeout`](crate::Mutex::lock_timeout)).
    #[error("{op} timed out after {after:?}")]
    Timeout {
        /// The operation that timed out.
        op: &'static str,
        /// How long it waited.
        after: Duration,
    },
    /// The session is lost (expired, past its local deadline, or closed): it is terminal.
    #[error("session lost: {0}")]
    SessionLost(SessionEnd),
    /// The guard or leadership is no longer held, and why: released, its entry deleted, or its
    /// session ended.
    #[error("not held: {0}")]
    NotHeld(LostReason),
    /// Our own queue entry vanished while we waited (deleted by someone else or expired).
    #[error("our queue entry {key} vanished")]
    EntryVanished {
        /// The entry's key or path.
        key: String,
    },
    /// A fence refused a token older than one it has already admitted.
    #[error("stale fencing token {token}: the resource has already admitted {highest}")]
    StaleToken {
        /// The refused token.
        token: FencingToken,
        /// The highest token the fence has admitted.
        highest: FencingToken,
    },
    /// Another error reported by the backend or its client library.
    #[error("{backend}: {op} failed")]
    Backend {
        /// Backend tag (`"etcd"`, `"zookeeper"`, `"redis"`, `"memory"`).
        backend: &'static str,
        /// The operation that failed.
        op: &'static str,
        /// Whether retrying may succeed (connection loss, leader change, ...).
        temporary: bool,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

/// The shape of every invalid-input error: what was given and why it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidInput {
    /// The rejected input as shown (at most 64 characters of a name; a value's length rather
    /// than its bytes).
    pub input: String,
    /// Why it was rejected.
    pub reason: Cow<'static, str>,
}

impl InvalidInput {
    /// An invalid input, showing at most 64 characters of `input`.
    pub fn new(input: impl AsRef<str>, reason: impl Into<Cow<'static, str>>) -> Self {
        let input = input.as_ref();
        let mut shown: String = input.chars().take(64).collect();
        if shown.len() < input.len() {
            shown.push('…');
        }
        InvalidInput {
            input: shown,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.input, self.reason)
    }
}

impl Error {
    /// Whether the same operation may succeed if retried unchanged (a connection blip, a
    /// leader change, a timeout). Invalid input, configuration, TLS, authentication,
    /// authorization and size limits, a lost session and stale tokens are never temporary.
    pub fn is_temporary(&self) -> bool {
        match self {
            Error::Backend { temporary, .. } | Error::Connect { temporary, .. } => *temporary,
            Error::Timeout { .. } => true,
            _ => false,
        }
    }

    /// Whether a release that failed so leaves its entry on the cluster for good: neither
    /// already gone ([`Error::NotHeld`]: released, or lost with its session) nor temporary
    /// (finished by the session's background task).
    pub(crate) fn leaves_entry(&self) -> bool {
        !matches!(self, Error::NotHeld(_)) && !self.is_temporary()
    }

    /// Builds an [`Error::InvalidName`], showing at most 64 characters of `name`.
    pub fn invalid_name(name: &str, reason: impl Into<Cow<'static, str>>) -> Self {
        Error::InvalidName(InvalidInput::new(name, reason))
    }

    /// Builds an [`Error::InvalidConfig`].
    pub fn invalid_config(input: impl AsRef<str>, reason: impl Into<Cow<'static, str>>) -> Self {
        Error::InvalidConfig(InvalidInput::new(input, reason))
    }

    /// Builds an [`Error::InvalidTtl`].
    pub fn invalid_ttl(ttl: Duration, reason: impl Into<Cow<'static, str>>) -> Self {
        Error::InvalidTtl(InvalidInput::new(format!("{ttl:?}"), reason))
    }

    /// Builds an [`Error::Backend`].
    pub fn backend(
        backend: &'static str,
        op: &'static str,
        temporary: bool,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            op,
            temporary,
            source: source.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_does_not_repeat_the_source() {
        let e = Error::backend("etcd", "enqueue", true, "connection reset");
        assert_eq!(e.to_string(), "etcd: enqueue failed");
        let source = std::error::Error::source(&e).expect("source");
        assert_eq!(source.to_string(), "connection reset");
        let long = "x".repeat(100);
        let e = Error::invalid_name(&long, "too long");
        assert!(e.to_string().contains('…'), "{e}");
    }

    #[test]
    fn temporary() {
        assert!(Error::backend("etcd", "x", true, "t").is_temporary());
        assert!(!Error::backend("etcd", "x", false, "t").is_temporary());
        assert!(!Error::SessionLost(SessionEnd::Expired).is_temporary());
        assert!(!Error::NotHeld(LostReason::Released).is_temporary());
        assert!(!Error::invalid_ttl(Duration::MAX, "too long").is_temporary());
    }
}
