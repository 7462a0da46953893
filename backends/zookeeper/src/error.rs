//! Mapping of `zookeeper-client` errors into [`fencelock::Error`].

use fencelock::{Error, SessionEnd};
use zookeeper_client as zk;

/// The backend tag used in errors and traces.
pub(crate) const NAME: &str = "zookeeper";

/// Maps a client error of operation `op`.
///
/// Session expiry (and a moved session) becomes [`Error::SessionLost`]; a closed client is a
/// closed session; failed authentication is [`Error::Unauthenticated`] and a refused ACL
/// [`Error::PermissionDenied`]; connection loss, timeouts and throttling are temporary;
/// everything else is a permanent [`Error::Backend`].
pub(crate) fn map(op: &'static str, e: zk::Error) -> Error {
    match e {
        zk::Error::SessionExpired | zk::Error::SessionMoved => {
            Error::SessionLost(SessionEnd::Expired)
        }
        zk::Error::AuthFailed => Error::Unauthenticated {
            backend: NAME,
            source: e.into(),
        },
        zk::Error::NoAuth => Error::PermissionDenied {
            backend: NAME,
            op,
            source: e.into(),
        },
        zk::Error::ClientClosed => Error::SessionLost(SessionEnd::Closed),
        e => {
            let temporary = is_temporary(&e);
            Error::backend(NAME, op, temporary, e)
        }
    }
}

/// Whether retrying may succeed: the connection dropped (the client reconnects by itself), the
/// server was slow or throttled us. The connection layer reports I/O failures as `Custom`.
fn is_temporary(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::ConnectionLoss
            | zk::Error::Timeout
            | zk::Error::Throttled
            | zk::Error::NoHosts
            | zk::Error::Custom(_)
    )
}

/// The temporary error of an operation that found the connection down.
pub(crate) fn disconnected(op: &'static str) -> Error {
    Error::backend(NAME, op, true, "disconnected from the ZooKeeper cluster")
}

/// The error for a session state that ends an operation, if it does: `Disconnected` is
/// temporary, the terminal states mean the session is lost.
pub(crate) fn state_error(op: &'static str, state: zk::SessionState) -> Option<Error> {
    match state {
        zk::SessionState::Disconnected => Some(disconnected(op)),
        zk::SessionState::Closed => Some(Error::SessionLost(SessionEnd::Closed)),
        s if s.is_terminated() => Some(Error::SessionLost(SessionEnd::Expired)),
        _ => None,
    }
}
