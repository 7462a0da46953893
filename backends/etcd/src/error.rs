//! Mapping etcd-client errors into [`fencelock::Error`], by gRPC status code.
//!
//! The code decides: `Unavailable`, `DeadlineExceeded`, `Aborted`, `Unknown` and `Cancelled`
//! are temporary (a member down, a leader change, a connection that broke); `PermissionDenied`,
//! `InvalidArgument`, `FailedPrecondition`, `ResourceExhausted`, `OutOfRange` and the rest are
//! permanent. Within a code, the message only picks the more precise error: a lease that is
//! gone (`NotFound`), failed credentials (`InvalidArgument`), a stale auth store revision or
//! token (retried), a member that is not the leader (`FailedPrecondition`, retried), a
//! server shedding load ("too many requests", `ResourceExhausted`, retried). A transport error
//! whose cause is a TLS certificate problem is permanent, whatever its code.

use std::error::Error as StdError;

use etcd_client::Error as E;
use fencelock::{Error, SessionEnd};
use tonic::Code;

pub(crate) const NAME: &str = "etcd";

/// Maps an etcd-client error of operation `op`.
pub(crate) fn map(op: &'static str, e: E) -> Error {
    let temporary = match &e {
        E::GRpcStatus(s) => match s.code() {
            Code::NotFound if s.message().contains("lease not found") => {
                return Error::SessionLost(SessionEnd::Expired)
            }
            Code::PermissionDenied => {
                return Error::PermissionDenied {
                    backend: NAME,
                    op,
                    source: readable(e),
                }
            }
            // No user given, to a cluster that requires one: etcd's words ("user name is
            // empty") read as if a user had been given empty.
            Code::InvalidArgument if s.message().contains("user name is empty") => {
                return Error::Unauthenticated {
                    backend: NAME,
                    source: "the cluster requires authentication, and no user was given".into(),
                }
            }
            Code::InvalidArgument if s.message().contains("authentication failed") => {
                return Error::Unauthenticated {
                    backend: NAME,
                    source: readable(e),
                }
            }
            Code::FailedPrecondition if s.message().contains("authentication is not enabled") => {
                return Error::invalid_config(
                    "user",
                    "a user is set, but authentication is not enabled on the etcd cluster",
                )
            }
            // Past the space quota (the NOSPACE alarm): writes that add data are refused until
            // an operator makes room.
            Code::ResourceExhausted if s.message().ends_with("mvcc: database space exceeded") => {
                return Error::OutOfSpace {
                    backend: NAME,
                    op,
                    source: readable(e),
                }
            }
            _ if tls_problem(s).is_some() => {
                return Error::Connect {
                    backend: NAME,
                    endpoints: String::new(),
                    temporary: false,
                    source: format!("TLS: {}", tls_problem(s).unwrap_or_default()).into(),
                }
            }
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::Unknown
            | Code::Cancelled => true,
            // Retried once the client refreshed its token (auto refresh is on).
            Code::Unauthenticated => true,
            Code::InvalidArgument => s.message().contains("revision of auth store is old"),
            Code::FailedPrecondition => s.message().contains("not leader"),
            // etcd sends two errors with this code: "too many requests" (its apply loop lags
            // behind commits: back off and retry, as etcd's own client does) and "database
            // space exceeded" (above).
            Code::ResourceExhausted => s.message().ends_with("etcdserver: too many requests"),
            _ => false,
        },
        E::LeaseKeepAliveError(m) if m.contains("lease not found") => {
            return Error::SessionLost(SessionEnd::Expired)
        }
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        E::InvalidArgs(m) => return Error::invalid_config("", m.clone()),
        E::InvalidUri(_) | E::InvalidMetadataValue(_) => {
            return Error::invalid_config("", e.to_string())
        }
        _ => false,
    };
    Error::backend(NAME, op, temporary, readable(e))
}

/// `e` in words: etcd-client's text of a gRPC status carries tonic's debug dump (`metadata:
/// MetadataMap {..}`, `source: tonic::transport::Error(Transport, hyper::Error(Http2, ..))`),
/// which a user read in the CLI's messages. A status says its code's description, its message
/// and its innermost cause's own words ("The service is currently unavailable: http2 error
/// (keep-alive timed out)").
fn readable(e: E) -> Box<dyn StdError + Send + Sync> {
    let E::GRpcStatus(s) = &e else {
        return e.into();
    };
    let mut text = format!("{}: {}", s.code().description(), s.message());
    let mut innermost = None;
    let mut cause = s.source();
    while let Some(c) = cause {
        innermost = Some(c);
        cause = c.source();
    }
    if let Some(words) = innermost.map(ToString::to_string) {
        if !words.is_empty() && !text.contains(&words) {
            text.push_str(&format!(" ({words})"));
        }
    }
    text.into()
}

/// Whether `e` says that the endpoint itself is out of reach: its connection was refused or
/// broke (a member killed or restarting). A live member's own refusals are not: etcd's errors
/// (say "etcdserver: no leader" from every follower during an election) start with
/// `etcdserver:`, and taking those members out of the rotation could leave only a hung one in
/// it.
pub(crate) fn unreachable(e: &E) -> bool {
    match e {
        E::TransportError(_) | E::IoError(_) => true,
        E::GRpcStatus(s) => {
            s.code() == Code::Unavailable && !s.message().starts_with("etcdserver:")
        }
        _ => false,
    }
}

/// The TLS certificate problem behind a transport error, if that is its cause (the server's
/// certificate not trusted, or our client certificate refused).
fn tls_problem(status: &tonic::Status) -> Option<String> {
    let mut cause: Option<&(dyn StdError + 'static)> = status.source();
    while let Some(e) = cause {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return certificate_error(tls);
        }
        if let Some(tls) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return certificate_error(tls);
        }
        cause = e.source();
    }
    None
}

fn certificate_error(e: &rustls::Error) -> Option<String> {
    match e {
        rustls::Error::InvalidCertificate(c) => {
            Some(format!("the server's certificate is not trusted ({c:?})"))
        }
        rustls::Error::AlertReceived(a) => {
            Some(format!("the server rejected our certificate ({a:?})"))
        }
        _ => None,
    }
}

/// A temporary error without an underlying client error.
pub(crate) fn temporary(op: &'static str, msg: &str) -> Error {
    Error::backend(NAME, op, true, msg.to_string())
}

/// The error for a watch the server refused (created and canceled at once), from its reason.
pub(crate) fn watch_refused(reason: &str) -> Error {
    if reason.contains("permission denied") {
        Error::PermissionDenied {
            backend: NAME,
            op: "watch",
            source: reason.to_string().into(),
        }
    } else {
        temporary("watch", &format!("watch refused: {reason}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, msg: &str) -> E {
        E::GRpcStatus(tonic::Status::new(code, msg))
    }

    #[test]
    fn unreachable_only_when_the_connection_failed() {
        assert!(unreachable(&status(Code::Unavailable, "transport error")));
        assert!(unreachable(&status(
            Code::Unavailable,
            "error trying to connect: tcp connect error: Connection refused (os error 111)"
        )));
        // A live member's answers: it stays in the rotation.
        assert!(!unreachable(&status(
            Code::Unavailable,
            "etcdserver: no leader"
        )));
        assert!(!unreachable(&status(
            Code::Unavailable,
            "etcdserver: leader changed"
        )));
        assert!(!unreachable(&status(
            Code::Unknown,
            "context deadline exceeded"
        )));
        assert!(!unreachable(&status(
            Code::NotFound,
            "etcdserver: requested lease not found"
        )));
    }

    /// A status is said in words, without tonic's debug dump; its innermost cause's words
    /// are kept.
    #[test]
    fn statuses_in_words() {
        #[derive(Debug)]
        struct Cause;
        impl std::fmt::Display for Cause {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("keep-alive timed out")
            }
        }
        impl StdError for Cause {}
        let mut s = tonic::Status::new(Code::Unavailable, "http2 error");
        s.set_source(std::sync::Arc::new(Cause));
        let e = map("close", E::GRpcStatus(s));
        let text = StdError::source(&e)
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(
            text.contains(
                "The service is currently unavailable: http2 error (keep-alive timed out)"
            ),
            "{text}"
        );
        for noise in [
            "metadata",
            "MetadataMap",
            "source:",
            "tonic",
            "grpc request error",
        ] {
            assert!(!text.contains(noise), "{text}");
        }
    }

    #[test]
    fn by_code() {
        let m = |e| map("op", e);
        assert!(m(status(Code::Unavailable, "etcdserver: no leader")).is_temporary());
        assert!(m(status(Code::Unavailable, "etcdserver: leader changed")).is_temporary());
        assert!(m(status(Code::Unknown, "context deadline exceeded")).is_temporary());
        assert!(!m(status(
            Code::ResourceExhausted,
            "grpc: received message larger than max"
        ))
        .is_temporary());
        assert!(!m(status(
            Code::InvalidArgument,
            "etcdserver: request is too large"
        ))
        .is_temporary());
        assert!(m(status(
            Code::ResourceExhausted,
            "etcdserver: too many requests"
        ))
        .is_temporary());
        assert!(matches!(
            m(status(
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded"
            )),
            Error::OutOfSpace { op: "op", .. }
        ));
        assert!(matches!(
            m(status(
                Code::NotFound,
                "etcdserver: requested lease not found"
            )),
            Error::SessionLost(SessionEnd::Expired)
        ));
        assert!(matches!(
            m(status(
                Code::PermissionDenied,
                "etcdserver: permission denied"
            )),
            Error::PermissionDenied { .. }
        ));
        assert!(matches!(
            m(status(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password"
            )),
            Error::Unauthenticated { .. }
        ));
        assert!(matches!(
            m(status(
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled"
            )),
            Error::InvalidConfig(_)
        ));
        assert!(m(status(
            Code::InvalidArgument,
            "etcdserver: revision of auth store is old"
        ))
        .is_temporary());
        assert!(m(status(
            Code::Unauthenticated,
            "etcdserver: invalid auth token"
        ))
        .is_temporary());
        assert!(matches!(
            m(E::InvalidArgs(
                "HTTPS URLs are only supported with TLS".into()
            )),
            Error::InvalidConfig(_)
        ));
        assert!(matches!(
            watch_refused(
                "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
            ),
            Error::PermissionDenied { .. }
        ));
        assert!(watch_refused("etcdserver: invalid auth token").is_temporary());
    }
}
