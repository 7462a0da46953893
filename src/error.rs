//! The one error type of fencelock.

use std::time::Duration;

use crate::LostReason;

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used throughout fencelock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in fencelock.
///
/// Backends map their client errors into [`Error::Backend`] (with a backend tag and the boxed
/// source) or into one of the more specific variants. Use [`Error::is_temporary`] to decide
/// whether a retry may succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lock, election or namespace name was rejected.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name (possibly truncated for display).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A session TTL or safety margin was rejected.
    #[error("invalid ttl {ttl:?}: {reason}")]
    InvalidTtl {
        /// The rejected TTL.
        ttl: Duration,
        /// Why it was rejected.
        reason: String,
    },
    /// Another configuration value was rejected.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The backend could not be reached within the connect timeout.
    #[error("{backend}: cannot connect to {endpoints}: {source}")]
    Connect {
        /// Backend tag (`"etcd"`, `"zookeeper"`, `"memory"`).
        backend: &'static str,
        /// The endpoints that were tried.
        endpoints: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// An operation did not finish within its deadline (for example [`crate::Mutex::lock_timeout`]).
    #[error("{op} timed out after {after:?}")]
    Timeout {
        /// The operation that timed out.
        op: &'static str,
        /// How long it waited.
        after: Duration,
    },
    /// The session is lost (expired, past its local deadline, or closed): it is terminal.
    #[error("session lost: {0}")]
    SessionLost(LostReason),
    /// The guard or leadership is no longer held (already released, or lost).
    #[error("not held: {0}")]
    NotHeld(&'static str),
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
        token: crate::FencingToken,
        /// The highest token the fence has admitted.
        highest: crate::FencingToken,
    },
    /// An error reported by the backend or its client library.
    #[error("{backend}: {op} failed: {source}")]
    Backend {
        /// Backend tag (`"etcd"`, `"zookeeper"`, `"memory"`).
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

impl Error {
    /// Whether the same operation may succeed if retried (a connection blip, a leader change,
    /// a timeout). Invalid input, a lost session, and stale tokens are never temporary.
    pub fn is_temporary(&self) -> bool {
        match self {
            Error::Backend { temporary, .. } => *temporary,
            Error::Connect { .. } | Error::Timeout { .. } => true,
            _ => false,
        }
    }

    /// Builds an [`Error::InvalidName`], showing at most 64 characters of `name`.
    pub fn invalid_name(name: &str, reason: &'static str) -> Self {
        let mut shown: String = name.chars().take(64).collect();
        if shown.len() < name.len() {
            shown.push('…');
        }
        Error::InvalidName {
            name: shown,
            reason,
        }
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
