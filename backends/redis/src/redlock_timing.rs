//! Redlock's limits and timing parameters.

use std::time::Duration;

/// The longest lock TTL accepted (one day).
pub const MAX_LOCK_TTL: Duration = Duration::from_secs(24 * 3600);

/// The shortest lock TTL accepted (10 ms). A TTL must also leave, less the drift allowance,
/// more than twice the request timeout ([`RedlockTiming::request_timeout`], 50 ms by default;
/// a grant takes two rounds): with the default timing, the shortest usable TTL is about
/// 104 ms.
pub const MIN_LOCK_TTL: Duration = Duration::from_millis(10);

/// The longest [`RedlockTiming::retry_delay`] accepted (one minute).
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

/// Redlock's timing parameters.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RedlockTiming {
    /// How long one request to one server may take before that server counts as failed
    /// (default 50 ms: small next to the TTL, so a slow or paused server does not eat the
    /// lock's validity). At least 1 ms and at most an hour.
    pub request_timeout: Duration,
    /// The clock drift allowed, as a fraction of the TTL (default 0.01), plus 2 ms.
    pub drift_factor: f64,
    /// The first retry delay of [`Redlock::lock_timeout`](crate::Redlock::lock_timeout) (default 50 ms, doubling up to 1 s
    /// or this delay if longer, with jitter so that contenders do not retry in step). More
    /// than zero and at most [`MAX_RETRY_DELAY`].
    pub retry_delay: Duration,
}

impl Default for RedlockTiming {
    fn default() -> Self {
        RedlockTiming {
            request_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
            retry_delay: Duration::from_millis(50),
        }
    }
}
