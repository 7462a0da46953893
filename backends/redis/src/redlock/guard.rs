//! The guard of a Redlock acquisition.

use std::time::Duration;

use fencelock::{FencingToken, Result};
use tokio::time::Instant;

use super::Redlock;

/// A lock held on a majority of servers. Release it with [`release`](Self::release); dropped
/// without a release, it expires after its TTL.
#[derive(Debug)]
#[must_use = "a lock that is not kept is released only when its TTL expires"]
pub struct RedlockGuard {
    pub(super) redlock: Redlock,
    pub(super) name: String,
    pub(super) value: String,
    pub(super) token: FencingToken,
    pub(super) valid_until: Instant,
}

impl RedlockGuard {
    /// The fencing token of this acquisition.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// How long the lock is still valid by this process's clock (zero once it is not).
    pub fn valid_for(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Releases the lock on every server that still holds it for us. Returns whether a
    /// majority still did (`false`: it had expired, and may be someone else's now).
    pub async fn release(self) -> Result<bool> {
        let released = self.redlock.release_all(&self.name, &self.value).await;
        Ok(released >= self.redlock.majority())
    }
}
