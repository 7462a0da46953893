//! What a Redis session believes it owns, to find out when the server lost some of its
//! changes.

use std::collections::HashMap;

/// What this session believes it owns on the server, to find out when a failover to a replica
/// lost some of its changes: a release lost that way brings the entry back, and the session's
/// own heartbeat would keep it alive for ever, blocking the lock.
///
/// Every script that changes what the session owns, and the heartbeat, carries the highest
/// version the client has seen; the server compares it with its own before it changes
/// anything. A version the client has seen was made before the request was sent, so a server
/// below it lost changes, whatever order the replies are handled in.
#[derive(Default)]
pub(crate) struct Owned {
    /// The highest version of the session's entries the server reported.
    pub(crate) version: i64,
    /// The server said it is behind that version: it lost changes.
    pub(crate) diverged: bool,
    /// The names of the entries created or being created, with how many times (a name repeats
    /// when a session re-queues on a lock before the release of its previous entry finished).
    pub(crate) names: HashMap<String, usize>,
}

impl Owned {
    /// A reply: the server's version, and whether it was behind the one the request carried.
    pub(crate) fn saw(&mut self, version: Option<i64>, behind: Option<i64>) {
        if let Some(v) = version {
            self.version = self.version.max(v);
        }
        if behind == Some(1) {
            self.diverged = true;
        }
    }

    pub(crate) fn track(&mut self, name: &str) {
        *self.names.entry(name.to_string()).or_default() += 1;
    }

    pub(crate) fn untrack(&mut self, name: &str) {
        if let Some(n) = self.names.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                self.names.remove(name);
            }
        }
    }
}
