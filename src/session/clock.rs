//! The clock of the local deadline.
//!
//! Tokio's `Instant` (`CLOCK_MONOTONIC` on Linux) stops while the machine is suspended: a
//! laptop or VM that sleeps past the TTL would wake up with its deadline still ahead, reporting
//! `Live` and `is_held() == true` while the cluster has expired the session and granted its
//! locks to someone else. So every deadline is also measured on a clock that keeps counting
//! through suspend, and it has passed as soon as either clock says so:
//!
//! - Linux and Android: `CLOCK_BOOTTIME`.
//! - macOS, iOS, FreeBSD and the other Unix systems: `CLOCK_MONOTONIC`, which counts sleep
//!   there (FreeBSD: `CLOCK_UPTIME` would not).
//! - Elsewhere (Windows): the monotonic `Instant` alone (`QueryPerformanceCounter` counts
//!   through sleep on current Windows).
//!
//! Timers still run on Tokio's clock (so tests can pause and advance it); after a resume the
//! heartbeat task notices the passed deadline at its next tick (at most a heartbeat period),
//! and `state()`/`is_held()` at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// A moment on both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// Tokio's monotonic clock (the one timers use).
    pub(crate) mono: Instant,
    /// The clock that counts through suspend, if the platform has one.
    boot: Option<Duration>,
}

impl Stamp {
    /// `d` later (at most a century: a TTL granted by a third-party backend or an odd
    /// server must not overflow the clock).
    pub(crate) fn after(self, d: Duration) -> Stamp {
        let d = d.min(Duration::from_secs(100 * 365 * 86_400));
        Stamp {
            mono: self.mono + d,
            boot: self.boot.map(|b| b.saturating_add(d)),
        }
    }

    /// The earlier of two moments, on each clock.
    pub(crate) fn min(self, other: Stamp) -> Stamp {
        Stamp {
            mono: self.mono.min(other.mono),
            boot: match (self.boot, other.boot) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// A session's clock: the two clocks, plus (for tests) time the machine spent suspended.
#[derive(Debug, Default)]
pub(crate) struct Clock {
    /// Nanoseconds of simulated suspend, added to the suspend-counting clock.
    suspended: AtomicU64,
    /// For a backend whose cluster counts time on Tokio's clock too (the memory backend): the
    /// moment the suspend-counting side counts from on Tokio's clock. A test's paused clock
    /// then rules both sides, as it rules the cluster's expiry: the machine's own clock,
    /// which runs on while a paused test's does not, would end sessions the cluster keeps.
    tokio_origin: Option<Instant>,
}

impl Clock {
    /// A clock whose suspend-counting side is Tokio's clock plus the simulated suspends (see
    /// `tokio_origin`).
    pub(crate) fn on_tokio_time() -> Clock {
        Clock {
            suspended: AtomicU64::new(0),
            tokio_origin: Some(Instant::now()),
        }
    }

    /// Now, on both clocks.
    pub(crate) fn now(&self) -> Stamp {
        Stamp {
            mono: Instant::now(),
            boot: self.boot_now(),
        }
    }

    /// Whether `at` has passed on either clock.
    pub(crate) fn passed(&self, at: Stamp) -> bool {
        let now = self.now();
        now.mono >= at.mono || matches!((now.boot, at.boot), (Some(n), Some(a)) if n >= a)
    }

    /// Plays a suspend of the machine for `d`: the suspend-counting clock jumps ahead, Tokio's
    /// does not.
    #[cfg(feature = "testing")]
    pub(crate) fn suspend(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.suspended.fetch_add(nanos, Ordering::SeqCst);
    }

    fn boot_now(&self) -> Option<Duration> {
        let extra = Duration::from_nanos(self.suspended.load(Ordering::SeqCst));
        match self.tokio_origin {
            Some(origin) => Some(origin.elapsed().saturating_add(extra)),
            None => suspend_counting_now().map(|t| t.saturating_add(extra)),
        }
    }
}

/// A deadline on both of the clocks a session's local deadline is measured on: Tokio's
/// monotonic clock, which timers use and which stops while the machine is suspended, and one
/// that counts through suspend (see the module's notes). It has passed as soon as either clock
/// says so: a process that wakes from a suspend past it does not believe it still ahead.
/// Implementer API, for a backend's own deadlines (Redlock's validity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(Stamp);

impl Deadline {
    /// `d` from now (at most a century).
    pub fn after(d: Duration) -> Deadline {
        Deadline(Clock::default().now().after(d))
    }

    /// How long until it passes on the first clock to reach it: zero once it has passed.
    pub fn remaining(&self) -> Duration {
        let now = Clock::default().now();
        let mono = self.0.mono.saturating_duration_since(now.mono);
        match (self.0.boot, now.boot) {
            (Some(at), Some(now)) => mono.min(at.saturating_sub(now)),
            _ => mono,
        }
    }

    /// Whether it has passed on either clock.
    pub fn passed(&self) -> bool {
        Clock::default().passed(self.0)
    }

    /// The same deadline as if the machine had been suspended for `d` since it was set (its
    /// suspend-counting side `d` nearer): for tests of what a suspend does.
    #[cfg(feature = "testing")]
    pub fn as_if_suspended(self, d: Duration) -> Deadline {
        Deadline(Stamp {
            mono: self.0.mono,
            boot: self.0.boot.map(|b| b.saturating_sub(d)),
        })
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn suspend_counting_now() -> Option<Duration> {
    // The fallible form: the infallible one unwraps the call's result, and a sandbox that
    // refuses the clock (a seccomp filter, an emulator) must cost the suspend check, not panic.
    let ts = rustix::time::clock_gettime_dynamic(rustix::time::DynamicClockId::Boottime).ok()?;
    Some(Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    ))
}

#[cfg(all(unix, not(any(target_os = "linux", target_os = "android"))))]
fn suspend_counting_now() -> Option<Duration> {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    Some(Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    ))
}

#[cfg(not(unix))]
fn suspend_counting_now() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suspend_passes_the_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let clock = Clock::default();
            let deadline = clock.now().after(Duration::from_secs(60));
            assert!(!clock.passed(deadline));
            #[cfg(feature = "testing")]
            {
                clock.suspend(Duration::from_secs(61));
                assert_eq!(clock.passed(deadline), cfg!(unix));
            }
        });
    }

    #[tokio::test]
    async fn a_deadline_counts_a_suspend() {
        let d = Deadline::after(Duration::from_secs(60));
        assert!(!d.passed());
        assert!(d.remaining() > Duration::from_secs(59));
        #[cfg(feature = "testing")]
        {
            let slept = d.as_if_suspended(Duration::from_secs(61));
            assert_eq!(slept.passed(), cfg!(unix));
            if cfg!(unix) {
                assert_eq!(slept.remaining(), Duration::ZERO);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_time_still_counts() {
        let clock = Clock::default();
        let deadline = clock.now().after(Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(clock.passed(deadline));
    }
}
