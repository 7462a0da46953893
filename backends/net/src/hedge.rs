//! Connection attempts hedged in time (see [`hedged`]).

use std::future::Future;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::{sleep_until, Instant};

/// How long the first attempt goes unanswered before a second one joins it; each later one
/// waits twice as long as the one before (1 s, 2 s, 4 s, …). A server answers a connection in
/// milliseconds, a slow link in a few round trips: a few attempts at most, and one on a link
/// of seconds' round trips is not cut short (the first is still waited for).
pub const FIRST_HEDGE: Duration = Duration::from_secs(1);

/// Runs `attempt()`, and once all attempts so far have gone unanswered for a while (see
/// [`FIRST_HEDGE`]), another beside them, until `deadline`: the first attempt to end gives
/// the outcome, an error too (an attempt fails fast only for a cause that a new connection
/// does not change: the caller's retries handle it). The others are dropped.
///
/// Each attempt must open a connection of its own and be bounded by the caller, by
/// `deadline` or about it: this waits for the attempts it started.
///
/// Why: a connection whose answers are lost (a middlebox that drops one direction of a
/// stream) stays silent for good, while one opened once the path healed is answered at once.
/// Waiting on the first until the connect timeout failed connects that the cluster could
/// have taken (black-box round 16).
pub async fn hedged<T, F, Fut>(deadline: Instant, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let mut running = FuturesUnordered::new();
    running.push(attempt());
    let mut gap = FIRST_HEDGE;
    let mut next = Instant::now() + gap;
    loop {
        if next >= deadline {
            return running.next().await.expect("an attempt runs");
        }
        tokio::select! {
            done = running.next() => return done.expect("an attempt runs"),
            () = sleep_until(next) => {
                running.push(attempt());
                gap *= 2;
                next += gap;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Attempts that never answer, but for the third: it is taken, the first two dropped.
    #[tokio::test(start_paused = true)]
    async fn a_later_attempt_answers_for_the_silent_ones() {
        let started = Instant::now();
        let tries = AtomicUsize::new(0);
        let deadline = started + Duration::from_secs(10);
        let won = hedged(deadline, || {
            let n = tries.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    std::future::pending::<()>().await;
                }
                n
            }
        })
        .await;
        assert_eq!(won, 2);
        // Started at 0 s, 1 s and 3 s.
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    /// An attempt that ends (an error, say) ends it: no other is started.
    #[tokio::test(start_paused = true)]
    async fn the_first_outcome_ends_it() {
        let tries = AtomicUsize::new(0);
        let deadline = Instant::now() + Duration::from_secs(10);
        let r: Result<(), &str> = hedged(deadline, || {
            tries.fetch_add(1, Ordering::SeqCst);
            async { Err("refused") }
        })
        .await;
        assert_eq!(r, Err("refused"));
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }

    /// None is started past the deadline: the ones running are waited for (bounded by their
    /// caller).
    #[tokio::test(start_paused = true)]
    async fn none_starts_past_the_deadline() {
        let started = Instant::now();
        let tries = AtomicUsize::new(0);
        let deadline = started + Duration::from_millis(2500);
        let r = hedged(deadline, || {
            tries.fetch_add(1, Ordering::SeqCst);
            tokio::time::timeout_at(deadline, std::future::pending::<()>())
        })
        .await;
        assert!(r.is_err());
        assert_eq!(started.elapsed(), Duration::from_millis(2500));
        // At 0 s and 1 s; the next was due at 3 s.
        assert_eq!(tries.load(Ordering::SeqCst), 2);
    }
}
