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
    /// majority still did (`false`: a majority answered and fewer held it, so it had expired
    /// and may be someone else's now). Fails, temporary, if fewer than a majority answered
    /// (whether it was still held is unknown; where it was not released it expires after its
    /// TTL), or permanently if servers refuse us for good (a wrong password, a permission).
    pub async fn release(self) -> Result<bool> {
        let answers = self.redlock.release_all(&self.name, &self.value).await;
        let majority = self.redlock.majority();
        if answers.iter().filter(|r| matches!(r, Ok(1))).count() >= majority {
            return Ok(true);
        }
        if answers.iter().filter(|r| r.is_ok()).count() >= majority {
            return Ok(false);
        }
        Err(self.redlock.no_majority(answers))
    }
}
