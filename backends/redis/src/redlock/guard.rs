//! The guard of a Redlock acquisition.

use std::time::Duration;

use fencelock::backend::Deadline;
use fencelock::{FencingToken, Result};

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
    pub(super) valid_until: Deadline,
}

impl RedlockGuard {
    /// The fencing token of this acquisition.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// How long the lock is still valid by this process's clocks (zero once it is not): the
    /// monotonic one, and one that counts while the machine is suspended (the servers' clocks
    /// run on meanwhile, and expire the lock).
    pub fn valid_for(&self) -> Duration {
        self.valid_until.remaining()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine suspended past the validity wakes with none left: the servers' clocks ran on
    /// and expired the lock meanwhile (the validity was on the monotonic clock alone, which
    /// stops during a suspend, and `valid_for` still said a second).
    #[tokio::test]
    async fn a_suspend_past_the_validity_leaves_none() {
        let guard = RedlockGuard {
            redlock: Redlock::connect(["redis://127.0.0.1:1"]).unwrap(),
            name: "x".into(),
            value: "v".into(),
            token: FencingToken::new(1),
            valid_until: Deadline::after(Duration::from_secs(1)),
        };
        assert!(guard.valid_for() > Duration::ZERO);
        let slept = RedlockGuard {
            valid_until: guard.valid_until.as_if_suspended(Duration::from_secs(2)),
            ..guard
        };
        // Where there is a clock that counts through suspend (see fencelock's session clock).
        if cfg!(unix) {
            assert_eq!(slept.valid_for(), Duration::ZERO);
        }
    }
}
