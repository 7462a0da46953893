//! Closing a session on the cluster through a client attached to it for that alone, and what
//! an unconfirmed close tells (see `Links::close_on_cluster`).

use std::time::Duration;

use fencelock::Error;
use zookeeper_client as zk;

use crate::config::Resolved;
use crate::error;

impl Resolved {
    /// Closes the session `info` on the cluster: a client attached to it for that alone (not
    /// detached) is dropped, which sends CloseSession, and its end awaited; each server is
    /// given `per_try` to take the session, in turn from `first` (see
    /// `Links::close_on_cluster`). [`Unconfirmed`] if none took the close.
    pub(crate) async fn close_session(
        &self,
        session_timeout: Duration,
        info: zk::SessionInfo,
        first: usize,
        per_try: Duration,
    ) -> std::result::Result<(), Unconfirmed> {
        let connector = self
            .connector(session_timeout, false)
            .map_err(|error| Unconfirmed {
                error,
                unanswered: false,
            })?
            .with_session(info);
        let mut last = None;
        let mut unanswered = false;
        // Twice round: a server sometimes drops the first attach right after the session's
        // previous client left it (the next one is taken) — unless a try went unanswered.
        let n = self.each.len();
        for i in 0..2 * n {
            if i == n && unanswered {
                break;
            }
            let server = (first + i) % n;
            // A server that cannot be reached at all (refused, or a host gone: no TCP
            // handshake) was sent nothing, and counts as a refusal; only one that took the
            // connection and then left the attach unanswered may have renewed the session.
            let (host, port) = &self.hosts[server];
            let reach = tokio::net::TcpStream::connect((host.as_str(), *port));
            match tokio::time::timeout(per_try, reach).await {
                Ok(Ok(_probe)) => {}
                Ok(Err(_)) => {
                    last = Some(zk::Error::ConnectionLoss);
                    continue;
                }
                Err(_) => {
                    last = Some(zk::Error::Timeout);
                    continue;
                }
            }
            let attempt = connector.clone().connect(&self.each[server]);
            let attempt = match tokio::time::timeout(per_try, attempt).await {
                Ok(attempt) => attempt,
                Err(_) => {
                    last = Some(zk::Error::Timeout);
                    unanswered = true;
                    continue;
                }
            };
            match attempt {
                Ok(client) => {
                    let mut state = client.state_watcher();
                    drop(client); // the only clone: CloseSession is sent
                    let closed = async {
                        while !state.state().is_terminated() {
                            state.changed().await;
                        }
                    };
                    // A server that took the session and then hangs: the next one is tried.
                    if tokio::time::timeout(per_try, closed).await.is_ok() {
                        return Ok(());
                    }
                    last = Some(zk::Error::Timeout);
                    unanswered = true;
                }
                Err(zk::Error::SessionExpired) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(Unconfirmed {
            error: error::map("close", last.unwrap_or(zk::Error::NoHosts)),
            unanswered,
        })
    }
}

/// A close of a session that no server confirmed (see [`Resolved::close_session`]).
pub(crate) struct Unconfirmed {
    /// Why the last try failed.
    pub(crate) error: Error,
    /// Whether a try went unanswered: its attach may have reached a server (a one-way
    /// partition, a server that hangs after it read the request), and each attach renews the
    /// session there. Trying again would keep alive the session the close is meant to end.
    pub(crate) unanswered: bool,
}
