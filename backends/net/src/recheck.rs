//! Waits that look again, now and then, at what no message reports (see [`recheck_every`]).

use std::future::Future;
use std::time::Duration;

use fencelock::{Error, Result};

/// How long a wait that a message ends (a deletion, a value, a queue's new head) goes at most
/// before it reads again: a third of the TTL, from 0.5 s to 5 s. A change made outside the
/// backend's own requests may reach nobody (an operator's delete of a waiter's entry: the waiter
/// watches only the entry ahead of it), and on Redis a message can be lost.
pub fn recheck_every(ttl: Duration) -> Duration {
    (ttl / 3).clamp(RECHECK_MIN, RECHECK_MAX)
}

/// The longest time between two reads.
const RECHECK_MAX: Duration = Duration::from_secs(5);
/// The shortest.
const RECHECK_MIN: Duration = Duration::from_millis(500);

/// Awaits `wait`, asking `still_there()` every [`recheck_every`]`(ttl)` whether the waiter's own
/// entry `key` still exists: the first `false` ends the wait with [`Error::EntryVanished`]
/// (the entry was deleted by hand: the waiter learnt it only at its turn, which a long-held
/// lock ahead of it puts off for as long as it is held). A wait that ends sooner costs a timer.
///
/// # Cancel safety
///
/// As cancel-safe as `wait` and `still_there`: `wait` is kept, never restarted, across checks.
pub async fn unless_own_vanishes<T, W, C, Fut>(
    ttl: Duration,
    key: &str,
    wait: W,
    mut still_there: C,
) -> Result<T>
where
    W: Future<Output = Result<T>>,
    C: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let every = recheck_every(ttl);
    tokio::pin!(wait);
    loop {
        if let Ok(done) = tokio::time::timeout(every, &mut wait).await {
            return done;
        }
        if !still_there().await? {
            return Err(Error::EntryVanished {
                key: key.to_string(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_third_of_the_ttl_within_bounds() {
        assert_eq!(recheck_every(Duration::from_secs(1)), RECHECK_MIN);
        assert_eq!(
            recheck_every(Duration::from_secs(6)),
            Duration::from_secs(2)
        );
        assert_eq!(recheck_every(Duration::from_secs(60)), RECHECK_MAX);
    }

    /// A wait that ends before the first check reads nothing; one that does not is ended by
    /// the first check that finds the entry gone, and not before.
    #[tokio::test(start_paused = true)]
    async fn ends_when_the_entry_is_found_gone() {
        let checks = AtomicUsize::new(0);
        let quick = unless_own_vanishes(Duration::from_secs(3), "k", async { Ok(7) }, || async {
            checks.fetch_add(1, Ordering::SeqCst);
            Ok(true)
        });
        assert_eq!(quick.await.unwrap(), 7);
        assert_eq!(checks.load(Ordering::SeqCst), 0);
        let start = tokio::time::Instant::now();
        let never = unless_own_vanishes(
            Duration::from_secs(3),
            "k",
            std::future::pending::<Result<()>>(),
            || async { Ok(checks.fetch_add(1, Ordering::SeqCst) < 2) },
        );
        match never.await {
            Err(Error::EntryVanished { key }) => assert_eq!(key, "k"),
            other => panic!("{other:?}"),
        }
        assert_eq!(checks.load(Ordering::SeqCst), 3);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }
}
