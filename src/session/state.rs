//! What a session, a guard or a leadership can be in, and why they end.

use std::fmt;

/// Why a session ended. Terminal: start a new session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SessionEnd {
    /// The cluster reported that the session expired.
    Expired,
    /// No heartbeat was confirmed before the local deadline (`ttl − safety margin` after the
    /// last confirmed heartbeat was sent): we step down by our own clock, before the cluster
    /// can grant our locks to anyone else.
    LocalDeadline,
    /// The session was closed with [`Session::close`](crate::Session::close) (or dropped, or
    /// the runtime that started it shut down: nothing heartbeats it any more).
    Closed,
}

impl fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SessionEnd::Expired => "the cluster expired the session",
            SessionEnd::LocalDeadline => "no heartbeat confirmed before the local deadline",
            SessionEnd::Closed => "the session was closed",
        })
    }
}

/// Why a guard or a leadership stopped being held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// Its session ended (and with it every lock of the session).
    Session(SessionEnd),
    /// Its entry was deleted by someone else (an operator, another tool).
    EntryDeleted,
    /// It was released or resigned by its owner.
    Released,
    /// Its server was replaced by a failover (Redis behind Sentinel, without
    /// `wait_for_replicas`), and the new one has other entries ahead of it, or lacks the entry
    /// (a replica that had not received it): the grant was made on a server that had lost
    /// track of them, or is unknown to the new one.
    Superseded,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Session(end) => fmt::Display::fmt(end, f),
            LostReason::EntryDeleted => f.write_str("our entry was deleted by someone else"),
            LostReason::Released => f.write_str("released by its owner"),
            LostReason::Superseded => f.write_str(
                "after a failover, the new server has others ahead of it or lacks it: granted on a server that had lost track of them",
            ),
        }
    }
}

impl From<SessionEnd> for LostReason {
    fn from(end: SessionEnd) -> Self {
        LostReason::Session(end)
    }
}

/// The observable state of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionState {
    /// The last heartbeat was confirmed; the local deadline is ahead.
    Live,
    /// A heartbeat failed or the connection dropped; the local deadline is still ahead, and
    /// heartbeats are retried. Locks are still held, but the holder should pause risky work.
    Suspended,
    /// Terminal: the session is gone. Start a new one.
    Lost(SessionEnd),
}
