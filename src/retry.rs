//! The one retry policy of fencelock ([`Backoff`]) and the one loop that applies it ([`Retry`]).

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures_util::future::BoxFuture;
use tokio::time::Instant;
use tracing::debug;

/// The smallest pause between two tries.
const MIN_DELAY: Duration = Duration::from_millis(20);
/// The largest pause between two tries.
const MAX_DELAY: Duration = Duration::from_secs(1);

/// The retry policy used by every retry loop of fencelock and its backends: exponential backoff
/// from 20 ms, doubling up to 1 s, each pause with random jitter of up to as much again (so
/// that sessions cut off together do not retry in lockstep): pauses of 20 ms to 2 s.
///
/// It has no limit on the number of tries: every loop that uses it ends by another rule. The
/// core retries only [temporary](crate::Error::is_temporary) errors and stops when the session
/// is lost (its local deadline bounds every retry); a connect stops at its connect timeout.
/// The heartbeat alone tries again after any error, until the local deadline.
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
    /// The bounds it was made with, to start again from the shortest pause.
    min: Duration,
    max: Duration,
}

impl Backoff {
    /// A fresh policy: the next pause is the shortest.
    pub fn new() -> Self {
        Self::capped(MAX_DELAY)
    }

    /// The policy of a loop that works for a session of `ttl`: pauses grow up to a twentieth
    /// of the TTL (at most 1 s; from 20 ms, or from the twentieth if that is less, at least
    /// 1 ms), and jitter adds up to as much again (a tenth of the TTL at most, for a TTL of
    /// 20 ms or more). A session's deadline keeps a fifth of its TTL in
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

    /// The same policy with pauses growing only up to `max`: for a loop that must notice a
    /// recovery sooner than a second later. The first pause is 20 ms, or `max` if that is
    /// less (at least 1 ms: a loop never spins): a session of a short TTL (the in-memory
    /// backend takes 10 ms) must be able to retry a heartbeat before its deadline.
    pub fn capped(max: Duration) -> Self {
        Self::between(MIN_DELAY.min(max).max(Duration::from_millis(1)), max)
    }

    /// The same policy with its first pause `min` (instead of 20 ms) and pauses growing up
    /// to `max` (at least `min`): for a loop whose tries are costly to the servers.
    pub fn between(min: Duration, max: Duration) -> Self {
        let max = max.max(min);
        let inner = ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build();
        Backoff { inner, min, max }
    }

    /// Starts again from the shortest pause (after a success).
    pub fn reset(&mut self) {
        *self = Self::between(self.min, self.max);
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

/// The one retry loop of fencelock and its backends: runs an operation until it succeeds,
/// pausing by a [`Backoff`] between tries. It ends, besides success, when
///
/// - the error is not worth another try (the caller's rule: for the core,
///   [`Error::is_temporary`](crate::Error::is_temporary), and the session still alive);
/// - the pause before the next try would end at or past the give-up instant, if one is set
///   ([`until`](Self::until)): the last error is returned then, never a pause that outlives
///   the caller's deadline.
///
/// Each pause counts in the retry metric of the backend given to [`counted`](Self::counted).
/// A caller that must stop at an event (a lost session, a shutdown) races the whole loop
/// against it: dropping the loop between tries or during one is safe, as the loop keeps no
/// state of its own beyond the backoff.
///
/// ```
/// use std::time::Duration;
/// use fencelock::backend::{Backoff, Retry};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mut tries = 0;
/// let answer: Result<u32, String> = Retry::new(Backoff::capped(Duration::from_millis(50)))
///     .run(
///         || {
///             tries += 1;
///             let now = tries;
///             async move { if now < 3 { Err(format!("try {now} failed")) } else { Ok(now) } }
///         },
///         |_e| true,
///     )
///     .await;
/// assert_eq!(answer, Ok(3));
///
/// // A rule that refuses the error ends the loop at once with it.
/// let refused: Result<(), &str> = Retry::new(Backoff::new()).run(|| async { Err("bad input") }, |_e| false).await;
/// assert_eq!(refused, Err("bad input"));
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a retry loop does nothing until run"]
pub struct Retry {
    backoff: Backoff,
    give_up: Option<Instant>,
    counted: Option<&'static str>,
}

impl Retry {
    /// A loop that pauses by `backoff` and has no deadline.
    pub fn new(backoff: Backoff) -> Self {
        Retry {
            backoff,
            give_up: None,
            counted: None,
        }
    }

    /// Gives up (with the last error) rather than pause past `give_up`; `None` never gives
    /// up by time.
    pub fn until(mut self, give_up: impl Into<Option<Instant>>) -> Self {
        self.give_up = give_up.into();
        self
    }

    /// Counts each retry in the retry metric of `backend`.
    pub fn counted(mut self, backend: &'static str) -> Self {
        self.counted = Some(backend);
        self
    }

    /// Runs `op` until it succeeds, `again` refuses its error, or the next pause would cross
    /// the give-up instant; returns the last result.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the try in progress (whose own cancel safety then applies)
    /// or the pause; nothing else is left behind.
    pub async fn run<T, E, F, Fut, A>(mut self, mut op: F, mut again: A) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        A: FnMut(&E) -> bool,
        E: Display,
    {
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) => self.after(e, &mut again).await?,
            }
        }
    }

    /// As [`run`](Self::run), for tries that change `state` (which each try borrows in
    /// turn, so that it needs no lock).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run); `state` keeps what the try in progress had written to it.
    pub async fn run_with<S, T, E, F, A>(
        mut self,
        state: &mut S,
        mut op: F,
        mut again: A,
    ) -> Result<T, E>
    where
        S: ?Sized,
        F: for<'s> FnMut(&'s mut S) -> BoxFuture<'s, Result<T, E>>,
        A: FnMut(&E) -> bool,
        E: Display,
    {
        loop {
            match op(state).await {
                Ok(v) => return Ok(v),
                Err(e) => self.after(e, &mut again).await?,
            }
        }
    }

    /// For an event loop that cannot hand its tries to [`run`](Self::run) (it waits on
    /// several sources at once, and a failed try is one of its events): the pause before the
    /// next try after a failed one that `again` accepts, counted like a pause of `run`; `None`
    /// when `again` refuses the error or the pause would cross the give-up instant. The loop
    /// calls [`succeeded`](Self::succeeded) after a success.
    ///
    /// ```
    /// use std::time::Duration;
    /// use fencelock::backend::{Backoff, Retry};
    /// let mut retry = Retry::new(Backoff::capped(Duration::from_millis(100)));
    /// let pause = retry.after_failure(&"unanswered", |_| true).expect("a pause");
    /// assert!(pause <= Duration::from_millis(100));
    /// assert_eq!(retry.after_failure(&"refused", |_| false), None);
    /// retry.succeeded(); // the next failure pauses the shortest again
    /// ```
    pub fn after_failure<E: Display>(
        &mut self,
        e: &E,
        mut again: impl FnMut(&E) -> bool,
    ) -> Option<Duration> {
        if !again(e) {
            return None;
        }
        let pause = self.backoff.next_delay();
        // (A pause too long for the clock is past any give-up point.)
        if self
            .give_up
            .is_some_and(|g| Instant::now().checked_add(pause).is_none_or(|t| t >= g))
        {
            return None;
        }
        debug!(error = %e, ?pause, "retrying");
        if let Some(backend) = self.counted {
            crate::metrics::retried(backend);
        }
        Some(pause)
    }

    /// After a success in an event loop (see [`after_failure`](Self::after_failure)): the
    /// next failure pauses the shortest again.
    pub fn succeeded(&mut self) {
        self.backoff.reset();
    }

    /// After a failed try: pauses before the next one (`Ok`), or gives up with `e`.
    async fn after<E: Display>(
        &mut self,
        e: E,
        again: &mut impl FnMut(&E) -> bool,
    ) -> Result<(), E> {
        match self.after_failure(&e, again) {
            Some(pause) => {
                tokio::time::sleep(pause).await;
                Ok(())
            }
            None => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn gives_up_with_the_last_error_rather_than_pause_past_the_deadline() {
        let start = Instant::now();
        let give_up = start + Duration::from_secs(1);
        let mut tries = 0;
        let answer: Result<(), String> = Retry::new(Backoff::capped(Duration::from_millis(100)))
            .until(give_up)
            .run(
                || {
                    tries += 1;
                    let now = tries;
                    async move { Err(format!("try {now}")) }
                },
                |_| true,
            )
            .await;
        assert_eq!(answer, Err(format!("try {tries}")));
        assert!(Instant::now() < give_up, "paused past the deadline");
        assert!(
            tries >= 8,
            "only {tries} tries in a second of pauses up to 100 ms"
        );
    }

    #[test]
    fn an_event_loop_pauses_longer_after_each_failure_and_shortest_after_a_success() {
        let mut retry = Retry::new(Backoff::capped(Duration::from_secs(1)));
        let pauses: Vec<Duration> = (0..6)
            .map(|_| retry.after_failure(&"failed", |_| true).unwrap())
            .collect();
        assert!(pauses[5] >= Duration::from_millis(320), "{pauses:?}");
        retry.succeeded();
        let first = retry.after_failure(&"failed", |_| true).unwrap();
        assert!(
            first <= Duration::from_millis(40),
            "{first:?} after a reset"
        );
        let mut until_now = Retry::new(Backoff::new()).until(Instant::now());
        assert_eq!(until_now.after_failure(&"failed", |_| true), None);
    }

    #[test]
    fn a_short_ttl_retries_within_its_margin() {
        // A session of 10 ms keeps 5 ms in hand: one failed heartbeat must not cost it.
        let mut b = Backoff::for_ttl(Duration::from_millis(10));
        let pauses: Vec<Duration> = (0..20).map(|_| b.next_delay()).collect();
        assert!(
            pauses.iter().all(|&d| d <= Duration::from_millis(2)),
            "{pauses:?}"
        );
        let mut floor = Backoff::capped(Duration::ZERO);
        assert!(
            floor.next_delay() >= Duration::from_millis(1),
            "a loop must not spin"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn run_with_lends_the_state_to_each_try() {
        let mut seen = Vec::new();
        let answer: Result<usize, String> = Retry::new(Backoff::new())
            .run_with(
                &mut seen,
                |seen| {
                    Box::pin(async move {
                        seen.push(seen.len());
                        if seen.len() < 3 {
                            Err("again".to_string())
                        } else {
                            Ok(seen.len())
                        }
                    })
                },
                |_| true,
            )
            .await;
        assert_eq!(answer, Ok(3));
        assert_eq!(seen, [0, 1, 2]);
    }
}
