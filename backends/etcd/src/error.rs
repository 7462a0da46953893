//! Mapping etcd-client errors into [`fencelock::Error`].

use fencelock::{Error, SessionEnd};

pub(crate) const NAME: &str = "etcd";

/// Maps an etcd-client error of operation `op`: transport failures, unavailability and leader
/// changes are temporary; a missing lease means the session expired.
pub(crate) fn map(op: &'static str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    let temporary = match &e {
        E::GRpcStatus(s) => {
            if s.message().contains("lease not found") {
                return Error::SessionLost(SessionEnd::Expired);
            }
            matches!(
                s.code(),
                tonic_code::Unavailable
                    | tonic_code::DeadlineExceeded
                    | tonic_code::Aborted
                    | tonic_code::Unknown
                    | tonic_code::Cancelled
                    | tonic_code::ResourceExhausted
            ) || s.message().contains("leader")
        }
        E::LeaseKeepAliveError(m) if m.contains("lease not found") => {
            return Error::SessionLost(SessionEnd::Expired)
        }
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        _ => false,
    };
    Error::backend(NAME, op, temporary, e)
}

/// A temporary error without an underlying client error.
pub(crate) fn temporary(op: &'static str, msg: &str) -> Error {
    Error::backend(NAME, op, true, msg.to_string())
}

mod tonic_code {
    pub(crate) use tonic::Code::*;
}
