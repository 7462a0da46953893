//! The one retry policy of fencelock.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The smallest pause between two tries.
const MIN_DELAY: Duration = Duration::from_millis(20);
/// The largest pause between two tries.
const MAX_DELAY: Duration = Duration::from_secs(1);

/// The retry policy used by every retry loop of fencelock and its backends: exponential backoff
/// from 20 ms, doubling up to 1 s, each pause with random jitter (so that sessions cut off
/// together do not retry in lockstep).
///
/// It has no limit on the number of tries: every loop that uses it ends by another rule. The
/// core retries only [temporary](crate::Error::is_temporary) errors and stops when the session
/// is lost (its local deadline bounds every retry); a connect stops at its connect timeout.
///
/// ```
/// use std::time::Duration;
/// let mut backoff = fencelock::backend::Backoff::new();
/// let first = backoff.next_delay();
/// assert!(first >= Duration::from_millis(20) && first <= Duration::from_millis(40));
/// assert!((0..50).map(|_| backoff.next_delay()).all(|d| d <= Duration::from_secs(2)));
/// ```
#[derive(Debug)]
pub struct Backoff {
    inner: ExponentialBackoff,
}

impl Backoff {
    /// A fresh policy: the next pause is the shortest.
    pub fn new() -> Self {
        Self::capped(MAX_DELAY)
    }

    /// The policy of a loop that works for a session of `ttl`: pauses grow up to a twentieth
    /// of the TTL (between 20 ms and 1 s). A session's deadline keeps a fifth of its TTL in
    /// hand, and what such a loop waits for (a new leader, a member back) must be noticed
    /// within a small part of that: a second's pause after an election would add a second
    /// without a grant.
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut backoff = fencelock::backend::Backoff::for_ttl(Duration::from_secs(2));
    /// assert!((0..50).map(|_| backoff.next_delay()).all(|d| d <= Duration::from_millis(200)));
    /// ```
    pub fn for_ttl(ttl: Duration) -> Self {
        Self::capped((ttl / 20).min(MAX_DELAY))
    }

    /// The same policy with pauses growing only up to `max` (at least the first pause): for a
    /// loop that must notice a recovery sooner than a second later.
    pub fn capped(max: Duration) -> Self {
        let inner = ExponentialBuilder::new()
            .with_min_delay(MIN_DELAY)
            .with_max_delay(max.max(MIN_DELAY))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build();
        Backoff { inner }
    }

    /// The pause before the next try.
    pub fn next_delay(&mut self) -> Duration {
        self.inner.next().unwrap_or(MAX_DELAY)
    }

    /// Sleeps for the pause before the next try.
    pub async fn pause(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}
