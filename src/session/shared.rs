//! The state one session shares with its handles and background tasks.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::clock::{Clock, Stamp};
use super::handoff::Cleanup;
use super::local::LocalQueues;
use super::state::{SessionEnd, SessionState};
use crate::backend::{Backend, BackendSession};
use crate::race::{race, First};
use crate::retry::{Backoff, Retry};
use crate::{Error, Result};

/// The inside of a [`Session`](crate::Session).
pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) remote: Arc<dyn BackendSession>,
    pub(crate) namespace: String,
    pub(crate) ttl: Duration,
    pub(crate) margin: Duration,
    /// The clock the local deadline is measured on (see [`super::clock`]).
    pub(crate) clock: Arc<Clock>,
    /// The local deadline: past it without a confirmed heartbeat, the session is lost.
    pub(crate) deadline: Arc<StdMutex<Stamp>>,
    pub(crate) state: watch::Sender<SessionState>,
    /// Cancelled when the session closes or its last handle goes.
    pub(crate) stop: CancellationToken,
    /// Heartbeats stopped on purpose (a test playing a paused process).
    pub(crate) halted: AtomicBool,
    /// Lost, but not closed on the cluster by anyone yet, which
    /// [`Session::close`](crate::Session::close) still does: its heartbeat task went unfinished
    /// (its runtime shut down), or the local deadline passed while `close_at_deadline` is off.
    pub(crate) orphaned: AtomicBool,
    /// Whether the heartbeat task closes the session on the cluster at the local deadline (see
    /// [`SessionBuilder::close_at_deadline`](crate::SessionBuilder::close_at_deadline)). Turned
    /// on later by [`close_once_lost`](Self::close_once_lost).
    pub(crate) close_at_deadline: AtomicBool,
    /// The local queues tasks of this session line up in before the cluster's.
    pub(crate) local: LocalQueues,
    cleanup: mpsc::UnboundedSender<Cleanup>,
    pub(crate) span: tracing::Span,
    /// Whether acquisition metrics carry the lock's name (see [`crate::metrics`]).
    pub(crate) metrics_names: bool,
}

/// Whether a close is to end the session on the cluster (see [`Shared::claim_close`]).
pub(crate) enum CloseClaim {
    /// Closed, or being closed, already.
    Nothing,
    /// It was live: its heartbeat task is there to end too.
    Live,
    /// Lost and left for a close: no heartbeat task closes it.
    Unclosed,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        remote: Arc<dyn BackendSession>,
        namespace: String,
        ttl: Duration,
        margin: Duration,
        clock: Clock,
        deadline: Stamp,
        cleanup: mpsc::UnboundedSender<Cleanup>,
        span: tracing::Span,
        metrics_names: bool,
        close_at_deadline: bool,
    ) -> Self {
        crate::metrics::session_state(None, SessionState::Live);
        let local = LocalQueues::new(backend.mutex_and_election_share_queue());
        Shared {
            backend,
            remote,
            namespace,
            ttl,
            margin,
            clock: Arc::new(clock),
            deadline: Arc::new(StdMutex::new(deadline)),
            state: watch::channel(SessionState::Live).0,
            stop: CancellationToken::new(),
            halted: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            close_at_deadline: AtomicBool::new(close_at_deadline),
            local,
            cleanup,
            span,
            metrics_names,
        }
    }

    pub(crate) fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The local deadline on Tokio's clock (for timers).
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline_stamp().mono
    }

    /// The local deadline on both clocks.
    pub(crate) fn deadline_stamp(&self) -> Stamp {
        *self.deadline.lock().unwrap()
    }

    /// The state, counting a passed local deadline as lost even before the heartbeat task
    /// noticed.
    pub(crate) fn state(&self) -> SessionState {
        let state = *self.state.borrow();
        match state {
            SessionState::Lost(_) => state,
            // Under the deadline's lock (see the heartbeat's move of it): a deadline found
            // passed here is never moved afterwards.
            _ if self.clock.passed(*self.deadline.lock().unwrap()) => {
                SessionState::Lost(SessionEnd::LocalDeadline)
            }
            _ => state,
        }
    }

    pub(crate) fn end(&self) -> Option<SessionEnd> {
        match self.state() {
            SessionState::Lost(r) => Some(r),
            _ => None,
        }
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        match self.end() {
            Some(r) => Err(Error::SessionLost(r)),
            None => Ok(()),
        }
    }

    /// Resolves when the session is lost (at once if it is): when the heartbeat task says so,
    /// or when the local deadline passes, whichever comes first. (The heartbeat task declares
    /// a passed deadline only once it runs: after a process stop, a suspend or on a busy
    /// runtime, later than the deadline, while [`state`](Self::state) already says lost; a
    /// caller racing its work against this future must not run a step past it.)
    pub(crate) fn lost(&self) -> impl Future<Output = SessionEnd> + Send + 'static {
        let mut rx = self.state.subscribe();
        let (deadline, clock) = (self.deadline.clone(), self.clock.clone());
        // Checked at every poll, whatever woke the task: timers fire one after another, and a
        // task woken by an earlier one (the caller's own work) may be polled before the
        // heartbeat task, woken by the deadline's timer, has said so. A loss already recorded
        // keeps its reason (a closed or expired session's deadline passes too, later). No
        // timer of its own: the heartbeat task's wakes the wait below at the deadline, and
        // what a caller's work gives past it is not used (see `unless_lost`).
        let passed = {
            let state = self.state.subscribe();
            std::future::poll_fn(move |_| match *state.borrow() {
                SessionState::Lost(r) => std::task::Poll::Ready(r),
                _ if clock.passed(*deadline.lock().unwrap()) => {
                    std::task::Poll::Ready(SessionEnd::LocalDeadline)
                }
                _ => std::task::Poll::Pending,
            })
        };
        let told = async move {
            loop {
                if let SessionState::Lost(r) = *rx.borrow_and_update() {
                    return r;
                }
                if rx.changed().await.is_err() {
                    return SessionEnd::Closed;
                }
            }
        };
        // Boxed: raced inside the futures of every waiting and held primitive (a Supervisor's
        // term nests several), whose size it would add to (a debug build's test thread
        // overflowed its stack).
        Box::pin(async move {
            match race(passed, told).await {
                First::Left(end) | First::Right(end) => end,
            }
        })
    }

    /// Records the end of the session (the first reason wins) and logs it.
    pub(crate) fn set_lost(&self, reason: SessionEnd) {
        self.lose(reason, false);
    }

    /// [`set_lost`](Self::set_lost), and if it is the end, marks the session as not closed on
    /// the cluster (`orphaned`), which [`Session::close`](crate::Session::close) then does.
    /// Returns whether it marked it.
    pub(crate) fn set_lost_unclosed(&self, reason: SessionEnd) -> bool {
        self.lose(reason, true)
    }

    /// From now on, a session lost by its local deadline is closed on the cluster at once, as
    /// with `close_at_deadline` on (for a session started with it off whose owner no longer
    /// needs the delay: the Supervisor once its term's future is gone). Returns whether it is
    /// lost already and left for a close, which is then the caller's to make (with
    /// [`Session::close`](crate::Session::close)).
    pub(crate) fn close_once_lost(&self) -> bool {
        self.close_at_deadline.store(true, Ordering::SeqCst);
        // After the store: the heartbeat task marks the loss, then reads the flag; one of the
        // two sees the other's write.
        self.orphaned.load(Ordering::SeqCst)
    }

    /// Claims the session's close on the cluster for the caller, under the state's lock (so
    /// that the heartbeat task's verdicts and other closes are ordered with it): `Live` if it
    /// was live (now lost: closed, or by its deadline if the clock passed it, though the
    /// heartbeat task has not said so yet), `Unclosed` if it was lost and left for a close
    /// (`orphaned`, taken now), `Nothing` if it is closed, or being closed, already.
    pub(crate) fn claim_close(&self) -> CloseClaim {
        let mut reason = SessionEnd::Closed;
        if self.clock.passed(self.deadline_stamp()) {
            reason = SessionEnd::LocalDeadline;
        }
        let mut unclosed = false;
        let ended = self.end_with(
            reason,
            || {},
            || unclosed = self.orphaned.swap(false, Ordering::SeqCst),
        );
        match (ended, unclosed) {
            (true, _) => CloseClaim::Live,
            (false, true) => CloseClaim::Unclosed,
            (false, false) => CloseClaim::Nothing,
        }
    }

    fn lose(&self, reason: SessionEnd, unclosed: bool) -> bool {
        // Marked under the state's lock: whoever reads the loss reads the mark too (and a
        // session closed meanwhile is not marked: its close is under way).
        let mark = || {
            if unclosed {
                self.orphaned.store(true, Ordering::SeqCst);
            }
        };
        self.end_with(reason, mark, || {}) && unclosed
    }

    /// Moves the state to `Lost(reason)` unless it is lost already, under the state's lock:
    /// `first` runs there if this is the end, `after` if it was lost before. Logs the end and
    /// returns whether it was this.
    fn end_with(&self, reason: SessionEnd, first: impl FnOnce(), after: impl FnOnce()) -> bool {
        let mut old = None;
        self.state.send_if_modified(|s| {
            if matches!(s, SessionState::Lost(_)) {
                after();
                false
            } else {
                first();
                old = Some(*s);
                *s = SessionState::Lost(reason);
                true
            }
        });
        if old.is_some() {
            crate::metrics::session_state(old, SessionState::Lost(reason));
            if reason != SessionEnd::Closed {
                warn!(%reason, "session lost");
            }
        }
        old.is_some()
    }

    /// Records Live or Suspended (never after Lost) and logs the change.
    pub(crate) fn set_state(&self, new: SessionState) {
        let mut old = None;
        self.state.send_if_modified(|s| {
            if matches!(s, SessionState::Lost(_)) || *s == new {
                false
            } else {
                old = Some(*s);
                *s = new;
                true
            }
        });
        if old.is_some() {
            crate::metrics::session_state(old, new);
        }
        match (old, new) {
            (Some(_), SessionState::Suspended) => info!("session suspended: heartbeat unconfirmed or connection lost; locks held until the local deadline"),
            (Some(SessionState::Suspended), SessionState::Live) => info!("session resumed: heartbeat confirmed"),
            _ => {}
        }
    }

    /// Runs `fut` unless the session is lost first ([`Error::SessionLost`] then). What `fut`
    /// gives is not used if the session is lost by the time it is done: after a stop past the
    /// local deadline (`SIGSTOP`, a suspend, a busy runtime) a reply already read is ready at
    /// the first poll, and would win the race.
    pub(crate) async fn unless_lost<T>(&self, fut: impl Future<Output = T>) -> Result<T> {
        match race(fut, self.lost()).await {
            First::Left(v) => match self.end() {
                None => Ok(v),
                Some(end) => Err(Error::SessionLost(end)),
            },
            First::Right(end) => Err(Error::SessionLost(end)),
        }
    }

    /// `r`, after recording the session's end if `r` is the backend's report of it (a request
    /// that found the session expired on the cluster: a lease revoked, a session key deleted).
    /// Without it the session stayed `Live`, and its guards held, until the heartbeat's next
    /// beat (up to a third of the TTL) after a call had returned `SessionLost` (black-box
    /// round 35: 0.66 s after another session was granted the lock).
    pub(crate) fn noted<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.note(e);
        }
        r
    }

    /// Records the session's end if `e` is the backend's report of it (see
    /// [`noted`](Self::noted)), left for a close as a session lost by its local deadline is
    /// (`orphaned`): [`Session::close`](crate::Session::close) still ends it on the cluster,
    /// should it live on there.
    pub(crate) fn note(&self, e: &Error) {
        if let Error::SessionLost(end) = e {
            self.set_lost_unclosed(*end);
        }
    }

    /// The retry policy of every loop working for this session ([`Backoff::for_ttl`]).
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::for_ttl(self.ttl)
    }

    /// Runs `op` until it succeeds, retrying temporary errors with [`Backoff`], and gives up
    /// with [`Error::SessionLost`] as soon as the session is lost.
    pub(crate) async fn retry<T, F, Fut>(&self, op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.retry_until(None, op).await
    }

    /// [`retry`](Self::retry) for a read (or a request that creates nothing): it also gives up,
    /// with the last temporary error, once the next pause would end past a TTL from now. A
    /// session that holds something is lost by then if its cluster stays away, and ends the
    /// loop so; one that holds nothing may never be (a Redis Cluster session sends no
    /// heartbeat while it holds nothing), and a read on a shard that stays away, retried
    /// while it lived, never ended (`Election::leader`, `fencelock list`).
    pub(crate) async fn retry_read<T, F, Fut>(&self, op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.retry_until(Instant::now().checked_add(self.ttl), op)
            .await
    }

    async fn retry_until<T, F, Fut>(&self, give_up: Option<Instant>, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let tries = Retry::new(self.backoff())
            .until(give_up)
            .counted(self.backend_name())
            .run(
                || {
                    let alive = self.check_alive();
                    let attempt = op();
                    async move {
                        alive?;
                        attempt.await
                    }
                },
                Error::is_temporary,
            );
        self.noted(self.unless_lost(tries).await?)
    }

    /// Hands work to the session's background task: never blocks, needs no runtime.
    pub(crate) fn hand_off(&self, work: Cleanup) {
        // If the worker is gone the session is gone, and so are its entries.
        let _ = self.cleanup.send(work);
    }
}
