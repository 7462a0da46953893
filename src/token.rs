//! Fencing tokens and the resource-side [`Fence`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// A fencing token: a number that strictly increases with every new holder of a lock (or every
/// new leader of an election, where it is the epoch).
///
/// On etcd it is the create revision of the holder's key; on ZooKeeper the `czxid` of the
/// holder's node; on the memory backend a per-backend counter. Pass it with every write to the
/// protected resource, and have the resource refuse tokens older than the newest it has seen
/// (see [`Fence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value, for storing next to the protected data.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<u64> for FencingToken {
    fn from(v: u64) -> Self {
        FencingToken(v)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> Self {
        t.0
    }
}

/// The resource side of fencing: remembers the highest token admitted so far and refuses older
/// ones.
///
/// A holder writes many times under one grant, so a token *equal* to the highest is admitted;
/// a smaller one is refused with [`Error::StaleToken`]. `admit` is one atomic operation, safe to
/// call from many threads.
///
/// One fence per lock (tokens of different locks are not ordered), kept with the resource: a
/// `Fence` lives in memory, so a resource that restarts stores [`highest`](Self::highest) with
/// its data and starts again from it ([`starting_at`](Self::starting_at)); a fence that starts
/// from nothing admits a stale holder's old token. (A database does it in the write itself:
/// `UPDATE … SET fence = $token WHERE fence <= $token`, see the `fenced_sql` example.)
///
/// ```
/// use fencelock::{Fence, FencingToken};
/// let fence = Fence::new();
/// assert!(fence.admit(FencingToken::new(34)).is_ok());
/// assert!(fence.admit(FencingToken::new(35)).is_ok());
/// assert!(fence.admit(FencingToken::new(35)).is_ok()); // the same holder writes again
/// assert!(fence.admit(FencingToken::new(34)).is_err()); // the stale holder is refused
/// ```
#[derive(Debug, Default)]
pub struct Fence {
    highest: AtomicU64,
}

impl Fence {
    /// A fence that has admitted nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fence that has admitted `highest` already: the one a restarted resource stored.
    ///
    /// ```
    /// use fencelock::{Fence, FencingToken};
    /// let stored = FencingToken::new(35); // saved with the resource's data before a restart
    /// let fence = Fence::starting_at(stored);
    /// assert!(fence.admit(FencingToken::new(34)).is_err());
    /// assert!(fence.admit(FencingToken::new(35)).is_ok());
    /// ```
    pub fn starting_at(highest: FencingToken) -> Self {
        Fence {
            highest: AtomicU64::new(highest.0),
        }
    }

    /// Admits `token` if it is at least the highest admitted so far, and records it.
    pub fn admit(&self, token: FencingToken) -> Result<()> {
        let prev = self.highest.fetch_max(token.0, Ordering::AcqRel);
        if prev > token.0 {
            Err(Error::StaleToken {
                token,
                highest: FencingToken(prev),
            })
        } else {
            Ok(())
        }
    }

    /// The highest token admitted so far (`None` before the first).
    pub fn highest(&self) -> Option<FencingToken> {
        match self.highest.load(Ordering::Acquire) {
            0 => None,
            v => Some(FencingToken(v)),
        }
    }
}
