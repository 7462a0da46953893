//! Mapping of `zookeeper-client` errors into [`fencelock::Error`].

use fencelock::Error;
use zookeeper_client as zk;

/// The backend tag used in errors and traces.
pub(crate) const NAME: &str = "zookeeper";

/// Maps a client error of operation `op`.
///
/// A client that found its session expired, moved away or closed is one *link* of the session
/// ended (see [`crate::link`]): temporary, as the session may live on through another client;
/// the session is lost when the cluster refuses to attach it again. Failed authentication is [`Error::Unauthenticated`] and a refused ACL
/// [`Error::PermissionDenied`]; connection loss, timeouts and throttling are temporary;
/// everything else is a permanent [`Error::Backend`].
pub(crate) fn map(op: &'static str, e: zk::Error) -> Error {
    match e {
        zk::Error::SessionExpired | zk::Error::SessionMoved | zk::Error::ClientClosed => {
            link_ended(op)
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

/// A temporary error of operation `op`.
pub(crate) fn temporary(op: &'static str, why: String) -> Error {
    Error::backend(NAME, op, true, why)
}

/// The temporary error of an operation whose client ended (see [`map`]).
pub(crate) fn link_ended(op: &'static str) -> Error {
    Error::backend(
        NAME,
        op,
        true,
        "the client's session ended (expired, moved or closed): confirming with the cluster",
    )
}

/// The error for a client state that ends an operation, if it does: both `Disconnected` and
/// the terminal states are temporary (see [`map`]); whether the session is lost, the session
/// itself tells the next operation.
pub(crate) fn state_error(op: &'static str, state: zk::SessionState) -> Option<Error> {
    match state {
        zk::SessionState::Disconnected => Some(disconnected(op)),
        s if s.is_terminated() => Some(link_ended(op)),
        _ => None,
    }
}
