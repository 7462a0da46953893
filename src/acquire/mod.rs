//! The acquire path shared by every primitive: the local queue first, then one remote entry
//! that waits only on the entries ahead that its rule depends on.

mod all;
mod pending;
mod wait;

use std::time::Duration;

use tokio::time::{timeout_at, Instant};
use tracing::{debug, info_span, Instrument};
use uuid::Uuid;

pub(crate) use all::acquire_all;
use pending::Pending;
use wait::{enqueue, Attempt};

use crate::backend::{EntryKind, Peer, QueueId, QueueKind};
use crate::session::{LocalQueue, LocalSlot, Shared};
use crate::tenure::Tenure;
use crate::{Error, Result, Session};

/// How long an acquisition may wait.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    /// Until granted (or the session is lost).
    Forever,
    /// Not at all: give up if the lock is taken.
    No,
    /// Until this instant, then fail with a timeout (`after` is the timeout asked for) and
    /// leave no entry.
    Until { deadline: Instant, after: Duration },
}

/// The instant `timeout` from now, or `None` (never) if it is too large for the clock, or
/// within a second of that: Tokio's timer rounds a deadline up to its next millisecond
/// unchecked, and would overflow on it.
pub(crate) fn deadline_after(timeout: Duration) -> Option<Instant> {
    let now = Instant::now();
    now.checked_add(timeout.saturating_add(Duration::from_secs(1)))?;
    Some(now + timeout)
}

impl Wait {
    /// Waiting for at most `timeout`. A timeout too large for the clock waits forever (it
    /// would never expire anyway): see [`deadline_after`].
    pub(crate) fn at_most(timeout: Duration) -> Wait {
        match deadline_after(timeout) {
            Some(deadline) => Wait::Until {
                deadline,
                after: timeout,
            },
            None => Wait::Forever,
        }
    }

    fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Until { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    /// When a bounded wait (`No`, `Until`) gives up on a cluster that does not answer: half a
    /// TTL past its deadline (past the call for `No`), at least a second and at most twenty.
    ///
    /// Why: the first enqueue, and the removal after a timeout, are not cut off by the wait's
    /// deadline (`lock_timeout(Duration::ZERO)` grants a free lock), and a request to a cluster
    /// that hangs is retried until the session's local deadline: `try_lock` and
    /// `lock_timeout(1s)` held their caller for most of a TTL, hours with a long one. Half a
    /// TTL, twenty seconds at most, is longer than a request stuck on one silent server takes
    /// to be retried on another: a third of the TTL on etcd, ten seconds at most; on ZooKeeper
    /// a move is found needed within 0.37 of the TTL, 15 s at the 40 s its servers grant at
    /// most by default. So a cluster with a healthy quorum still answers within it; past it,
    /// silence is an answer the caller of a bounded wait wants.
    pub(crate) fn give_up(self, ttl: Duration) -> Option<(Instant, Duration)> {
        let patience = (ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(20));
        let from = match self {
            Wait::Forever => return None,
            Wait::No => Instant::now(),
            Wait::Until { deadline, .. } => deadline,
        };
        // With the margin of `deadline_after` (Tokio's timer rounds up unchecked).
        from.checked_add(patience.saturating_add(Duration::from_secs(1)))
            .map(|_| (from + patience, patience))
    }

    fn timed_out(self) -> Error {
        let after = match self {
            Wait::Until { after, .. } => after,
            _ => Duration::ZERO,
        };
        Error::Timeout {
            op: "acquire",
            after,
        }
    }
}

/// Which entries ahead an entry waits for: the grant rule of one primitive.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rule {
    /// Granted at the head of the queue: waits for the entry just ahead (mutex, election,
    /// writer).
    Exclusive,
    /// Granted when no exclusive entry is ahead: waits for the nearest exclusive entry ahead
    /// (reader).
    Shared,
    /// Granted when fewer than this many entries are ahead: waits for any of them to go (a
    /// semaphore's permit; only one waiter at a time does, see [`crate::Semaphore`]).
    Permits(usize),
}

impl Rule {
    /// The indexes in `ahead` of the entries to wait for next (any one of them going is
    /// progress); empty when granted.
    fn targets(self, ahead: &[Peer]) -> Vec<usize> {
        match self {
            Rule::Exclusive => ahead.len().checked_sub(1).into_iter().collect(),
            Rule::Shared => ahead
                .iter()
                .rposition(|p| p.kind == EntryKind::Exclusive)
                .into_iter()
                .collect(),
            Rule::Permits(n) if ahead.len() < n => Vec::new(),
            Rule::Permits(_) => (0..ahead.len()).collect(),
        }
    }

    /// What [`targets`](Self::targets) needs to know of the entries ahead: their kind (or any)
    /// and how many of the nearest. A semaphore's waiter needs its `n` nearest: fewer than `n`
    /// entries ahead can only come about if one of those goes.
    fn window(self) -> (Option<EntryKind>, usize) {
        match self {
            Rule::Exclusive => (None, 1),
            Rule::Shared => (Some(EntryKind::Exclusive), 1),
            Rule::Permits(n) => (None, n),
        }
    }
}

/// What to acquire: one entry of `kind` in `queue`, granted by `rule`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) queue: &'a QueueId,
    pub(crate) kind: EntryKind,
    pub(crate) rule: Rule,
    pub(crate) value: &'a [u8],
    /// Whether the acquisition and its hold are recorded in the metrics (not a semaphore's
    /// gate, whose semaphore records its own).
    pub(crate) recorded: bool,
    /// Where the acquisition began, if before this request (a semaphore's lease, after its
    /// gate), and whether it waited there: the metrics' wait runs from the call.
    pub(crate) since: Option<(Instant, bool)>,
}

/// Checks an entry value against the backend's limit.
pub(crate) fn check_value(shared: &Shared, value: &[u8]) -> Result<()> {
    value_fits(shared.backend_name(), value)
}

/// Checks a value (a candidate's, one proclaimed, a semaphore permit's) as every backend
/// does, before anything is connected: at most
/// [`MAX_VALUE_LEN`](crate::backend::MAX_VALUE_LEN) bytes, and not the value a revocation
/// request writes ([`REVOKE_MARKER`](crate::backend::REVOKE_MARKER)). Fails with
/// [`Error::InvalidValue`].
///
/// ```
/// assert!(fencelock::validate_value(b"10.0.0.7:8080").is_ok());
/// assert!(fencelock::validate_value(b"__REVOKE__").is_err());
/// ```
pub fn validate_value(value: &[u8]) -> Result<()> {
    value_fits("", value)
}

/// Checks an entry value against the limit of the backend named `backend` (any, if empty).
pub(crate) fn value_fits(backend: &str, value: &[u8]) -> Result<()> {
    let max = crate::backend::MAX_VALUE_LEN;
    if value.len() > max {
        let whose = match backend {
            "" => String::new(),
            b => format!("{b} backend's "),
        };
        return Err(Error::InvalidValue(crate::error::InvalidInput::new(
            format!("{} bytes", value.len()),
            format!("longer than the {whose}limit of {max} bytes"),
        )));
    }
    if value == crate::backend::REVOKE_MARKER {
        // A holder whose value is the marker would take itself for revoked.
        return Err(Error::InvalidValue(crate::error::InvalidInput::new(
            "__REVOKE__",
            "the value a revocation request writes, reserved for it",
        )));
    }
    Ok(())
}

/// Acquires `req` for `session`, holding the local queue slot `local` (if the primitive has a
/// local queue). Returns `None` only for
/// [`Wait::No`] when the lock is taken.
///
/// The first enqueue request is never cut off by a timeout: a timeout bounds the waiting and
/// the retries. So `lock_timeout(Duration::ZERO)` grants a free lock, exactly like
/// `try_lock`. A cluster that does not answer ends a bounded wait at [`Wait::give_up`] (a
/// temporary error; whatever the attempt may have created is removed by the session's
/// background task, or goes with the session).
pub(crate) async fn acquire(
    session: &Session,
    req: Request<'_>,
    local: Option<LocalSlot>,
    wait: Wait,
) -> Result<Option<Tenure>> {
    use crate::metrics::{acquisition, primitive, Outcome};
    let (started, waited_before) = req.since.unwrap_or_else(|| (Instant::now(), false));
    let mut waited_here = false;
    let attempt = acquire_recorded(session, req, local, wait, &mut waited_here);
    let res = unless_silent(session.shared(), wait, attempt).await;
    let waited = waited_before || waited_here;
    let res = res.map(|t| t.map(|t| t.with_waited(waited)));
    let outcome = Outcome::of(&res, waited, started);
    if req.recorded {
        let name = session
            .shared()
            .metrics_names
            .then_some(req.queue.name.as_str());
        acquisition(primitive(req.queue, req.kind), name, outcome);
    }
    res
}

/// `attempt`, unless the cluster stays silent past `wait`'s [`give_up`](Wait::give_up):
/// then the attempt is dropped (its undo handed to the background task) and a temporary error
/// tells why.
pub(crate) async fn unless_silent<T>(
    shared: &Shared,
    wait: Wait,
    attempt: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let Some((at, patience)) = wait.give_up(shared.ttl) else {
        return attempt.await;
    };
    timeout_at(at, attempt).await.unwrap_or_else(|_| {
        Err(Error::backend(
            shared.backend_name(),
            "acquire",
            true,
            format!(
                "the cluster did not answer within {:?} past the wait",
                // In whole milliseconds: "8.333s", not "8.333333333s" (black-box round 25).
                Duration::from_millis(u64::try_from(patience.as_millis()).unwrap_or(u64::MAX))
            ),
        ))
    })
}

/// [`acquire`], telling through `waited` whether the grant had to wait for another holder.
async fn acquire_recorded(
    session: &Session,
    req: Request<'_>,
    local: Option<LocalSlot>,
    wait: Wait,
    waited: &mut bool,
) -> Result<Option<Tenure>> {
    let shared = session.shared().clone();
    shared.check_alive()?;
    let span = info_span!(parent: &shared.span, "acquire", queue = %req.queue, token = tracing::field::Empty);
    async {
        let mut pending = Pending {
            shared: shared.clone(),
            queue: req.queue.clone(),
            kind: req.kind,
            attempt: Uuid::new_v4(),
            inflight: None,
            maybe_created: false,
            entry: None,
            local,
            undoing: None,
        };
        let enqueued = enqueue(&shared, req, &mut pending, wait).await;
        let res = match enqueued {
            Ok(enqueued) => {
                // Kept where a drop finds it to undo; the turn borrows it from there.
                let own = &*pending.entry.insert(enqueued.entry);
                let attempt = Attempt {
                    shared: &shared,
                    req,
                    own,
                    wait,
                };
                let turn = attempt.turn(enqueued.ahead, waited);
                match wait.deadline() {
                    Some(d) => timeout_at(d, turn)
                        .await
                        .unwrap_or_else(|_| Err(wait.timed_out())),
                    None => turn.await,
                }
                .map(|granted| granted.then_some(()))
            }
            Err(e) => Err(e),
        };
        match res {
            Ok(Some(())) => {
                // Granted: never report a grant past the local deadline.
                shared.check_alive()?;
                let entry = pending.entry.take().expect("granted entry");
                let local = pending.local.take();
                // An earlier failed create attempt is settled: the retry found or created our
                // one entry, so there is nothing left to abandon.
                pending.maybe_created = false;
                tracing::Span::current().record("token", entry.token.get());
                debug!(key = %entry.key, "granted");
                let tenure = Tenure::new(session.clone(), req.queue.clone(), entry, local)
                    .with_window(req.rule.window());
                Ok(Some(if req.recorded {
                    tenure
                } else {
                    tenure.unrecorded()
                }))
            }
            Ok(None) => {
                pending.cleanup_now().await?;
                Ok(None)
            }
            Err(e @ Error::Timeout { .. }) => {
                pending.cleanup_now().await?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
    .instrument(span)
    .await
}

/// Acquires `req` after this session's local turn on its queue (a reader's turn if
/// `shared_turn`): what a mutex, a read-write lock and an election do. The metrics count the
/// acquisition from the call, the local wait included, and one that ends there (a `try_*` that
/// found another task of the session holding it, a timeout) too.
pub(crate) async fn acquire_in_turn(
    session: &Session,
    mut req: Request<'_>,
    shared_turn: bool,
    wait: Wait,
) -> Result<Option<Tenure>> {
    let started = Instant::now();
    let (local, waited) = match local_turn(session.shared(), req.queue, shared_turn, wait).await {
        Ok(Some(turn)) => turn,
        ended => {
            let ended = ended.map(|_| None::<()>);
            if req.recorded {
                let shared = session.shared();
                let name = shared.metrics_names.then_some(req.queue.name.as_str());
                let outcome = crate::metrics::Outcome::of(&ended, true, started);
                let primitive = crate::metrics::primitive(req.queue, req.kind);
                crate::metrics::acquisition(primitive, name, outcome);
            }
            return ended.map(|_| None);
        }
    };
    req.since = Some((started, waited));
    acquire(session, req, Some(local), wait).await
}

/// Waits for this session's local turn on `queue` (see [`crate::session::LocalQueue`]), a
/// reader's turn if `shared_turn` (in a read-write lock), and tells whether it had to wait.
/// Returns `None` only for [`Wait::No`] when another task of the session has it.
pub(crate) async fn local_turn(
    shared: &Shared,
    queue: &QueueId,
    shared_turn: bool,
    wait: Wait,
) -> Result<Option<(LocalSlot, bool)>> {
    shared.check_alive()?;
    let make = match queue.kind {
        QueueKind::ReadWrite => LocalQueue::read_write,
        _ => LocalQueue::exclusive,
    };
    let q = shared.local.get(queue, make);
    if let Some(free) = q.clone().try_lock(shared_turn) {
        return Ok(Some((free, false)));
    }
    match wait {
        Wait::No => Ok(None),
        Wait::Forever => shared
            .unless_lost(q.lock(shared_turn))
            .await
            .map(|slot| Some((slot, true))),
        Wait::Until { deadline, .. } => shared
            .unless_lost(timeout_at(deadline, q.lock(shared_turn)))
            .await?
            .map(|slot| Some((slot, true)))
            .map_err(|_| wait.timed_out()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_past_the_clock_are_never() {
        assert!(deadline_after(Duration::from_secs(1)).is_some());
        assert!(deadline_after(Duration::MAX).is_none());
        // The last second before the clock's end: not a deadline Tokio's timer could take.
        let mut lo = Duration::ZERO;
        let mut hi = Duration::MAX;
        // The largest timeout the clock can add, to within a millisecond.
        while hi - lo > Duration::from_millis(1) {
            let mid = lo + (hi - lo) / 2;
            if Instant::now().checked_add(mid).is_some() {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        assert!(deadline_after(lo).is_none());
        assert!(deadline_after(lo.saturating_sub(Duration::from_millis(500))).is_none());
        assert!(deadline_after(lo.saturating_sub(Duration::from_secs(2))).is_some());
    }
}
