//! Bounded requests: how long one request to etcd may wait for its answer, and the two ways of
//! waiting — a plain bound ([`within`]), and a bound with copies sent meanwhile ([`hedged`]).

use std::time::Duration;

use fencelock::{Error, Result};

use crate::error::{map, temporary};

/// How long one request may wait for its answer: a third of the TTL, at least half a second.
///
/// A request that went to a member just before it died (or hung) is not answered until the
/// connection gives up, seconds later (7 s were measured when the leader was killed): the
/// revocation of a lost session and the lease of its replacement waited that long, and the lock
/// with them. Bounded, the request fails as temporary and its retry goes to a member that
/// answers (the endpoint monitor takes a silent one out of the rotation within about a second).
/// Every request is safe to repeat: a create whose reply was lost is found again by its key.
/// Reads, lease grants and revocations, and releases also send a copy within the bound
/// ([`hedged`]).
pub(crate) fn request_bound(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(500))
}

/// How long a [`hedged`] request waits before it sends a copy: a quarter of its bound.
fn hedge_after(bound: Duration) -> Duration {
    bound / 4
}

/// The answer to `send()`, or a temporary error once `bound` has passed without one; every
/// [`hedge_after`] without an answer the same request is sent again beside those in flight,
/// and the first answer wins (the others are dropped, which cancels them).
///
/// Why: a request that a follower forwards to a leader that has just died is never answered
/// (the proposal, or the read's index request, is lost with the leader), and the followers
/// notice the death only when their election timer fires, a second or two later. A request
/// sent in that window would hold the operation for its whole bound (and the revocation of a
/// lost session, the lock with it); a copy sent after the election is answered at once.
///
/// Only for requests whose repetition is harmless in any order: reads (txns that only read
/// among them), a lease's grant (a lease granted twice expires unused), its revocation, and
/// the removal of an entry guarded by its create revision. Not for other writes: a copy of a
/// create that applied after the entry's removal would leave an entry nobody knows of.
pub(crate) async fn hedged<T, F>(
    bound: Duration,
    op: &'static str,
    mut send: impl FnMut() -> F,
) -> Result<T>
where
    F: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    use futures::stream::{FuturesUnordered, StreamExt};
    use tokio::time::{sleep_until, Instant};
    let give_up = Instant::now() + bound;
    let every = hedge_after(bound);
    let mut next = Instant::now() + every;
    let mut tries = FuturesUnordered::new();
    tries.push(send());
    loop {
        tokio::select! {
            biased;
            Some(answer) = tries.next() => return answer.map_err(|e| map(op, e)),
            () = sleep_until(give_up) => return Err(unanswered(op)),
            () = sleep_until(next), if next < give_up => {
                tries.push(send());
                next += every;
            }
        }
    }
}

/// The temporary error of a request `op` unanswered within its bound.
fn unanswered(op: &'static str) -> Error {
    temporary(op, "no answer within a third of the TTL")
}

/// `fut`, or a temporary error once `bound` has passed without an answer.
pub(crate) async fn within<T>(
    bound: Duration,
    op: &'static str,
    fut: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(bound, fut).await {
        Ok(r) => r.map_err(|e| map(op, e)),
        Err(_) => Err(unanswered(op)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    type Answer<T> = std::result::Result<T, etcd_client::Error>;

    #[tokio::test(start_paused = true)]
    async fn a_copy_answers_for_a_request_lost_on_the_way() {
        let sent = AtomicU64::new(0);
        let answer = hedged(Duration::from_millis(400), "read", || {
            let n = sent.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    std::future::pending::<()>().await;
                }
                Answer::Ok(n)
            }
        })
        .await;
        assert_eq!(answer.unwrap(), 1);
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_request_sends_no_copy() {
        let sent = AtomicU64::new(0);
        let answer = hedged(Duration::from_millis(400), "read", || {
            sent.fetch_add(1, Ordering::SeqCst);
            async { Answer::Ok(7) }
        })
        .await;
        assert_eq!(answer.unwrap(), 7);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(sent.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_it_gives_up_at_its_bound_as_temporary() {
        let sent = AtomicU64::new(0);
        let started = tokio::time::Instant::now();
        let answer = hedged(Duration::from_millis(400), "read", || {
            sent.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Answer<()>>()
        })
        .await;
        assert!(answer.unwrap_err().is_temporary());
        assert_eq!(started.elapsed(), Duration::from_millis(400));
        // Sent at 0, 100, 200 and 300 ms.
        assert_eq!(sent.load(Ordering::SeqCst), 4);
    }
}
