//! Mapping `redis` errors into [`fencelock::Error`], by the error's kind and the server's error
//! code, never its message (but for one error that has no code of its own).
//!
//! Temporary: I/O errors (refused, reset, timed out), `LOADING`, `TRYAGAIN`, `MASTERDOWN`,
//! `READONLY` (a replica that was, or is about to be, promoted), `CLUSTERDOWN`, `MOVED` and
//! `ASK` (a cluster's slot moving), a script's key on another node (likewise), `BUSY` (a
//! script running long), `MISCONF` (a server that cannot persist refuses writes), `NOREPLICAS`
//! (too few replicas follow the primary for it to accept writes). Authentication failures
//! (`NOAUTH`, `WRONGPASS`, a failed `AUTH` at connect) are [`Error::Unauthenticated`], `NOPERM`
//! is [`Error::PermissionDenied`], a bad URL is [`Error::InvalidConfig`], `OOM` (at
//! `maxmemory`) is [`Error::OutOfSpace`]; every other server error (a script error) is
//! permanent.

use fencelock::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

pub(crate) const NAME: &str = "redis";

/// Maps a `redis` error of operation `op`.
pub(crate) fn map(op: &'static str, e: RedisError) -> Error {
    let temporary = match e.kind() {
        ErrorKind::AuthenticationFailed => {
            return Error::Unauthenticated {
                backend: NAME,
                source: readable(&e).into(),
            }
        }
        ErrorKind::Server(ServerErrorKind::NoPerm) => {
            return Error::PermissionDenied {
                backend: NAME,
                op,
                source: readable(&e).into(),
            }
        }
        // A server that wants a password and got none (`NOAUTH`), or a rejected `AUTH` sent
        // by hand (`WRONGPASS`): the client's own parse leaves both as plain codes.
        _ if matches!(e.code(), Some("NOAUTH" | "WRONGPASS")) => {
            return Error::Unauthenticated {
                backend: NAME,
                source: readable(&e).into(),
            }
        }
        // A server at `maxmemory` that may not evict: refuses what adds data (new entries,
        // sessions), and runs what does not (see `scripts::run`).
        _ if e.code() == Some("OOM") => {
            return Error::OutOfSpace {
                backend: NAME,
                op,
                source: readable(&e).into(),
            }
        }
        ErrorKind::InvalidClientConfig => return Error::invalid_config("", readable(&e)),
        // A TLS handshake that failed on a certificate (reported as an I/O error): the server's
        // not trusted is a wrong setting (a `rediss://` URL with the system's trust store and a
        // server of a private CA), ours refused is a refusal of our credentials.
        ErrorKind::Io => match fencelock_net::certificate_failure(&e) {
            Some(fencelock_net::Probe::ClientCertificate(_)) => {
                return Error::Unauthenticated {
                    backend: NAME,
                    source: readable(&e).into(),
                }
            }
            Some(_) => false,
            None => true,
        },
        // A cluster's node the client has no connection to yet (it reconnects).
        ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::ClusterDown
            // A cluster's slot that moved (redis-rs follows the redirection a few times, then
            // gives up with it: the cluster is still settling after a failover or a move).
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => true,
        // A script running past `busy-reply-threshold`, a server that cannot persist, a
        // primary refusing writes while fewer than `min-replicas-to-write` replicas follow it.
        _ if matches!(e.code(), Some("BUSY" | "MISCONF" | "NOREPLICAS")) => true,
        // A script that met a key of its slot on another node (the slot migrating): Redis
        // gives this one no code of its own, only its message.
        _ if moved_under_script(&e.to_string()) => true,
        // A server at `maxclients` (at connect): others will leave (no code of its own either).
        _ if e.to_string().contains("max number of clients reached") => true,
        _ => e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal(),
    };
    Error::backend(NAME, op, temporary, readable(&e))
}

/// Whether `e` (mapped by [`map`]) is a request that met a Redis Cluster slot half moved: a
/// script stopped by a key of its slot on the other node (`TRYAGAIN`, "non local key"), or a
/// redirection redis-rs gave up following.
pub(crate) fn slot_moving(e: &Error) -> bool {
    let Error::Backend { source, .. } = e else {
        return false;
    };
    let text = source.to_string();
    ["TRYAGAIN", "ASK", "MOVED"]
        .iter()
        .any(|code| text.starts_with(code))
        || moved_under_script(&text)
}

/// Whether a script's error `text` says that it met a key of its slot on the other node (the
/// slot migrating): Redis gives this no code of its own, only a message, which 7.4 changed.
fn moved_under_script(text: &str) -> bool {
    text.contains("non local key in a cluster node")
        || text.contains("during rehashing of the slot")
}

/// `e` in words: redis-rs writes its error kind's debug name into its text ("Password
/// authentication failed - AuthenticationFailed", "refused to switch database -
/// Server(ResponseError): DB index is out of range"), which a user read in the CLI's messages.
///
/// A server's own error is said as the server said it (`NOPERM this user has no
/// permissions…`), where redis-rs writes its kind's name (`NoPerm: this user…`).
fn readable(e: &RedisError) -> String {
    // Said as etcd's and ZooKeeper's connects say it (it read "Connection refused (os error
    // 111)").
    if e.is_connection_refusal() {
        return fencelock_net::Probe::Refused.to_string();
    }
    let text = e.to_string();
    if let Some(code) = e.code() {
        let named = match e.kind() {
            ErrorKind::Server(kind) => format!("{kind:?}"),
            _ => format!("{code:?}"),
        };
        if let Some(rest) = text.strip_prefix(&named) {
            return format!("{code}{}", rest.strip_prefix(':').unwrap_or(rest));
        }
    }
    let kind = format!(" - {:?}", e.kind());
    match text.split_once(&kind) {
        Some((words, detail)) => format!("{words}{detail}"),
        None => text,
    }
}

/// A temporary error of operation `op` with a message of our own.
pub(crate) fn temporary(op: &'static str, message: &'static str) -> Error {
    Error::backend(NAME, op, true, message)
}

/// A reply that does not have the shape the script returns (a foreign script loaded under our
/// keys, or a bug): permanent, since retrying would read the same.
pub(crate) fn unexpected(op: &'static str) -> Error {
    Error::backend(NAME, op, false, "unexpected reply from a fencelock script")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server at its client limit refuses a connection for now: temporary, so that a
    /// connect retries (it was taken for a setting the server refused, for good).
    #[test]
    fn a_server_full_of_clients_is_temporary() {
        let e = redis::parse_redis_value(b"-ERR max number of clients reached\r\n")
            .and_then(redis::Value::extract_error)
            .expect_err("a server's error");
        assert!(map("connect", e).is_temporary());
    }

    /// An error is said in words, without redis-rs' kind names.
    #[test]
    fn errors_in_words() {
        let auth = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(readable(&auth), "Password authentication failed");
        for (reply, said) in [
            (
                &b"-NOPERM this user has no permissions to run the 'evalsha' command\r\n"[..],
                "NOPERM this user has no permissions to run the 'evalsha' command",
            ),
            (
                &b"-WRONGPASS invalid username-password pair\r\n"[..],
                "WRONGPASS invalid username-password pair",
            ),
            (
                &b"-READONLY You can't write against a read only replica.\r\n"[..],
                "READONLY You can't write against a read only replica.",
            ),
        ] {
            let e = redis::parse_redis_value(reply)
                .and_then(redis::Value::extract_error)
                .expect_err("a server's error");
            assert_eq!(readable(&e), said, "{e}");
        }
        let db = RedisError::from((
            ErrorKind::Io,
            "Redis server refused to switch database",
            "DB index is out of range".to_string(),
        ));
        assert_eq!(
            readable(&db),
            "Redis server refused to switch database: DB index is out of range"
        );
    }
}
