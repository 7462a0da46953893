//! Supervision for long-running services: keep leading, or keep holding a lock, across session
//! losses, and shut down gracefully.

use std::future::Future;
use std::pin::pin;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use futures_util::FutureExt;
use tracing::{info, warn};

use crate::race::{race, First};
use crate::retry::{Backoff, Retry};
use crate::{
    Error, Guard, Leadership, LostReason, Result, Session, SessionBuilder, SessionEnd, SessionState,
};

/// Keeps a process leading an election, or holding a lock, across session losses.
///
/// A session is terminal: once it expires (a long pause, a partition past the TTL), every lock
/// and leadership of it is gone for good. A long-running service usually wants to take part
/// again: the supervisor re-creates the session (with backoff and jitter while the cluster is
/// unreachable), campaigns or locks again, and hands your code a fresh [`Leadership`] or
/// [`Guard`] each time, the way client-go's `leaderelection` (`OnStartedLeading` /
/// `OnStoppedLeading` / `ReleaseOnCancel`) and Curator's `LeaderSelector` with `autoRequeue` do.
/// (To share leadership with a `LeaderSelector` on ZooKeeper, use [`hold`](Self::hold): it is
/// a mutex on its path, not an election.)
///
/// Your code runs as a future; when leadership is lost the future is dropped (stop everything
/// it started) and a new one is started at the next term. On `shutdown` the future is dropped and
/// the session is closed at once, so that a successor takes over in milliseconds rather than
/// a TTL.
///
/// Supervision ends when your future returns. Releasing the guard (its last reentered share),
/// resigning the leadership, dropping it or closing its session inside your future is your
/// decision, not a loss: no new term is started, your
/// future is left to run to its end (the release is never cut short), and supervision then ends
/// as for a future that returned. (To step down for a while and take part again, return and
/// call `lead`/`hold` again.)
///
/// Your closure must move the [`Leadership`] or [`Guard`] into the future it returns. One that
/// drops it instead (`|_leader| async { serve().await }`: the closure's argument is dropped
/// when the closure returns) would leave the future running without the grant, and another
/// process leading beside it: supervision ends with [`Error::InvalidConfig`] before that future
/// is ever polled.
///
/// Errors end supervision only when they are permanent: a temporary error, a lost session, or a
/// waiting entry deleted by someone else (an operator) leads to another try. An invalid name or
/// value is reported at once, before any session is started (also while the cluster is down).
///
/// After a loss the next term starts in a new session, the old one closed: a grant your code
/// kept beyond its term (moved into a spawned task, say) cannot hold up the next one. A term
/// lost by its session's local deadline is dropped before that session is closed on the
/// cluster (the supervisor starts its sessions with
/// [`close_at_deadline(false)`](SessionBuilder::close_at_deadline)), so that no successor is
/// granted while the old term's future is still there; the cluster's expiry, a safety margin
/// later, bounds the wait if the future takes longer to drop.
///
/// A panic in your future unwinds out of `lead`/`hold`: supervision ends, and the session is
/// closed as its handles drop (the grant goes with it). A handle your code moved elsewhere (a
/// grant in a spawned task) keeps the session until it drops, or until the session is lost
/// by its local deadline, when it is closed at once.
///
/// Once your future has released its grant and runs on to its end, its session is closed as
/// soon as it is lost by its local deadline: whatever else your code still holds in it (a lock
/// taken through `guard.session()`) goes then too.
///
/// Terms lost one after the other soon after they began (an operator or a script deleting each
/// new entry, a session lost as soon as it starts) are spaced by the retry policy's growing
/// pauses (from 20 ms up to 1 s, with jitter of up to as much again), so that supervision never loops at the speed of
/// the cluster's replies. A term that lasted [`QUICK_LOSS`](Self::QUICK_LOSS) or longer is
/// taken up again at once, and the pauses start again from the shortest.
///
/// ```
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock::{MemoryBackend, Session, Supervisor};
///
/// let supervisor = Supervisor::new(Session::builder(MemoryBackend::new()));
/// let shutdown = tokio::time::sleep(Duration::from_millis(200)); // ctrl-c, SIGTERM, ...
/// supervisor
///     .lead("orders-primary", b"node-a:8080", shutdown, |leader| async move {
///         println!("leading with epoch {}", leader.epoch());
///         std::future::pending::<()>().await; // serve until deposed or shut down
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Supervisor {
    builder: SessionBuilder,
}

/// Why one term ended.
enum TermEnd {
    /// Shutdown was asked for.
    Shutdown,
    /// The user's future returned.
    Done,
    /// The tenure was lost.
    Lost(LostReason),
    /// The user's closure dropped the grant instead of moving it into its future.
    GrantDropped,
}

impl Supervisor {
    /// A term lost sooner than this after it began counts as a quick loss: the next term waits
    /// for a growing pause (see [`Supervisor`]).
    pub const QUICK_LOSS: Duration = Duration::from_secs(10);

    /// A supervisor that starts its sessions with `builder`.
    pub fn new(builder: SessionBuilder) -> Self {
        Supervisor { builder }
    }

    /// Campaigns in election `name` with `value` and runs `lead` with each leadership won, until
    /// `shutdown` resolves or a `lead` future returns (then it resigns). Leadership lost
    /// (session expired, local deadline, entry deleted) drops the `lead` future and starts a
    /// new campaign, in a new session (the old one closed). A `lead` future that resigns
    /// (or drops its leadership, or closes its session) is not deposed: it runs on until it returns, and supervision
    /// ends then. A waiting candidacy whose entry is deleted campaigns again.
    ///
    /// Returns `Ok(())` after a shutdown or a `lead` that returned, with the session closed;
    /// an error only if it is permanent (an invalid name or value, authentication, permission).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is a shutdown without waiting: the `lead` future is dropped, and
    /// the session's last handle with it, so its background task closes the session on the
    /// cluster (the leadership and any waiting candidacy go at once). A handle your code moved
    /// elsewhere keeps the session until it drops, or until the session is lost (see
    /// [`Supervisor`]).
    pub async fn lead<F, Fut>(
        &self,
        name: &str,
        value: impl AsRef<[u8]>,
        shutdown: impl Future<Output = ()>,
        mut lead: F,
    ) -> Result<()>
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future<Output = ()>,
    {
        let value = value.as_ref().to_vec();
        self.builder.check_name(name)?;
        crate::acquire::value_fits(self.builder.backend_name(), &value)?;
        self.supervise(
            name,
            "Leadership",
            shutdown,
            |session, name| {
                let value = value.clone();
                let name = name.to_string();
                async move { session.election(&name)?.campaign(value).await }
            },
            |leader: Leadership| {
                info!(epoch = %leader.epoch(), "leading");
                let lost = leader.lost();
                (lost, lead(leader))
            },
        )
        .await
    }

    /// Locks `name` and runs `work` with each guard, until `shutdown` resolves or a `work`
    /// future returns (then it releases). A lost lock drops the `work` future and locks again.
    /// A `work` future that releases (or drops) its guard, its last reentered one, or closes
    /// its session runs on until it returns, and supervision ends then.
    ///
    /// A lost lock locks again in a new session (the old one closed).
    ///
    /// Returns as [`lead`](Self::lead) does.
    ///
    /// # Cancel safety
    ///
    /// As [`lead`](Self::lead): dropping the future drops `work` and closes the session (the
    /// lock is released with it).
    pub async fn hold<F, Fut>(
        &self,
        name: &str,
        shutdown: impl Future<Output = ()>,
        mut work: F,
    ) -> Result<()>
    where
        F: FnMut(Guard) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.builder.check_name(name)?;
        self.supervise(
            name,
            "Guard",
            shutdown,
            |session, name| {
                let name = name.to_string();
                async move { session.mutex(&name)?.lock().await }
            },
            |guard: Guard| {
                info!(token = %guard.token(), "holding");
                // The tenure's end, not this guard's: the work may hold on through a guard it
                // reentered and drop this one.
                let lost = guard.tenure_lost();
                (lost, work(guard))
            },
        )
        .await
    }

    /// The loop behind [`lead`](Self::lead) and [`hold`](Self::hold); `grant` names what a
    /// term hands the user's closure.
    async fn supervise<T, A, AF, S, L, UF>(
        &self,
        name: &str,
        grant: &str,
        shutdown: impl Future<Output = ()>,
        mut acquire: A,
        mut start: S,
    ) -> Result<()>
    where
        A: FnMut(Session, &str) -> AF,
        AF: Future<Output = Result<T>>,
        S: FnMut(T) -> (L, UF),
        L: Future<Output = LostReason>,
        UF: Future<Output = ()>,
    {
        let mut shutdown = pin!(shutdown);
        // The session of the last term, if it lives on; taken and put back by each try.
        let session: Mutex<Option<Session>> = Mutex::new(None);
        let acquire = Mutex::new(&mut acquire);
        // The pauses between terms lost quickly, one after the other.
        let mut quick_losses = Backoff::new();
        loop {
            // A session (a new one after a loss), then the lock or leadership.
            let obtained = Retry::new(Backoff::new()).run(
                || self.obtain(&session, &acquire, name),
                |e| {
                    e.is_temporary()
                        || matches!(e, Error::SessionLost(_) | Error::EntryVanished { .. })
                },
            );
            let (s, tenure) = match race(shutdown.as_mut(), obtained).await {
                First::Right(Ok(got)) => got,
                ended => {
                    // Shutdown, or a permanent error: the session kept for a next try goes.
                    close_kept(&session).await;
                    return match ended {
                        First::Right(Err(e)) => Err(e),
                        _ => Ok(()),
                    };
                }
            };
            // The user's future lives in this block alone: dropped (and whatever it holds and
            // started with it) before the session is closed on a shutdown, so that no work of
            // the old term runs on while a successor takes over.
            let began = Instant::now();
            // Should the loop end without closing the term's session (a panic in the user's
            // future, or this future dropped) while a handle of it lives on (a grant the
            // user's code moved into a spawned task), a lost one is closed all the same.
            let mut close_if_lost = CloseIfLost(Some(s.clone()));
            let end = {
                let (lost, user) = start(tenure);
                let (mut lost, mut user) = (pin!(lost), pin!(user));
                // Polled once before the user's future, as the race below would first. Ended
                // already by a release: the closure dropped the grant instead of moving it
                // into the future, which would run on without it (beside the next holder).
                // Ended otherwise (lost before the first poll): a loss as any other (`lost`
                // is done, and must not be polled again).
                let first = match lost.as_mut().now_or_never() {
                    Some(LostReason::Released) => None,
                    Some(reason) => Some(First::Right(First::Left(reason))),
                    None => Some(race(shutdown.as_mut(), race(lost, user.as_mut())).await),
                };
                match first {
                    None => TermEnd::GrantDropped,
                    Some(First::Left(())) => TermEnd::Shutdown,
                    Some(First::Right(First::Left(reason))) if ended_by_the_work(reason, &s) => {
                        // The user's own code released, resigned or dropped the grant, or
                        // closed its session: its choice, not a loss. Let it finish (dropping
                        // it now would cut its release short), then end as for a returned
                        // future. Its session, lost meanwhile, is closed at once: it is not
                        // closed by its heartbeat task (see `obtain`), and what it still
                        // holds (a release that failed) would stay until the cluster's expiry.
                        let close_when_lost = async {
                            let _ = s.lost().await;
                            let _ = s.close().await;
                            std::future::pending::<std::convert::Infallible>().await
                        };
                        match race(shutdown.as_mut(), race(user.as_mut(), close_when_lost)).await {
                            First::Left(()) => TermEnd::Shutdown,
                            First::Right(First::Left(())) => TermEnd::Done,
                            First::Right(First::Right(never)) => match never {},
                        }
                    }
                    Some(First::Right(First::Left(reason))) => TermEnd::Lost(reason),
                    Some(First::Right(First::Right(()))) => TermEnd::Done,
                }
            };
            // Each arm below closes the session itself.
            close_if_lost.0 = None;
            match end {
                TermEnd::GrantDropped => {
                    let _ = s.close().await;
                    return Err(Error::invalid_config(
                        format!("the term's {grant}"),
                        "dropped by the closure before its future ran: move it into the future \
                         that uses it",
                    ));
                }
                TermEnd::Shutdown | TermEnd::Done => {
                    // Everything at once: the successor takes over in milliseconds.
                    let _ = s.close().await;
                    return Ok(());
                }
                TermEnd::Lost(reason) => {
                    warn!(%reason, "lost: taking part again");
                    // A new session for the next term: a grant of this one that the user's
                    // code kept (moved into a spawned task) would hold its local queue slot,
                    // and the next campaign in this session would wait behind it for ever.
                    session.lock().unwrap().take();
                    // A lost session too: one left for its close at its deadline (see
                    // `SessionBuilder::close_at_deadline`) holds its entries until then.
                    let _ = s.close().await;
                    if began.elapsed() >= Self::QUICK_LOSS {
                        quick_losses.reset();
                    } else if let First::Left(()) =
                        race(shutdown.as_mut(), quick_losses.pause()).await
                    {
                        close_kept(&session).await;
                        return Ok(());
                    }
                }
            }
        }
    }

    /// One try at a term: the session of the last term if it lives on (else a new one), then
    /// `acquire` in it. The session is kept in `session` for the next try whatever happens,
    /// unless it is lost.
    async fn obtain<T, A, AF>(
        &self,
        session: &Mutex<Option<Session>>,
        acquire: &Mutex<&mut A>,
        name: &str,
    ) -> Result<(Session, T)>
    where
        A: FnMut(Session, &str) -> AF,
        AF: Future<Output = Result<T>>,
    {
        let live = session
            .lock()
            .unwrap()
            .take()
            .filter(|s| !matches!(s.state(), SessionState::Lost(_)));
        let s = match live {
            Some(s) => s,
            // Not closed by its heartbeat task at the local deadline: the loop drops the
            // term's future first, then closes the session, so that no successor is granted
            // while the old term's code still runs (see `SessionBuilder::close_at_deadline`).
            None => self
                .builder
                .clone()
                .close_at_deadline(false)
                .start()
                .await
                .inspect_err(|e| {
                    warn!(error = %e, "cannot start a session yet");
                })?,
        };
        *session.lock().unwrap() = Some(s.clone());
        let acquiring = (acquire.lock().unwrap())(s.clone(), name);
        match acquiring.await {
            Ok(t) => {
                session.lock().unwrap().take();
                Ok((s, t))
            }
            Err(Error::SessionLost(end)) => {
                warn!(%end, "session lost while waiting: starting a new one");
                session.lock().unwrap().take();
                let _ = s.close().await;
                Err(Error::SessionLost(end))
            }
            Err(e) => {
                // Our waiting entry deleted by someone else (an operator) while the session
                // lives on is nothing permanent: the loop queues again after a pause, in case
                // someone keeps deleting it.
                warn!(error = %e, "cannot acquire");
                Err(e)
            }
        }
    }
}

/// The term's session, while the loop has not closed it (see `supervise`): on drop, it is
/// closed if lost, and closed by its heartbeat task if lost later.
struct CloseIfLost(Option<Session>);

impl Drop for CloseIfLost {
    fn drop(&mut self) {
        let Some(s) = self.0.take() else {
            return;
        };
        // The term's future is gone: a later loss by the deadline is closed by the heartbeat
        // task, as by default. One that came already was left unclosed for the loop: the first
        // poll of `close` claims it and hands the close to a task of its own (outside a
        // runtime, the heartbeat task closes it when its last handle drops).
        if s.shared().close_once_lost() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = s.close().await;
                });
            }
        }
    }
}

/// Closes the session kept for a next try, if any.
async fn close_kept(session: &Mutex<Option<Session>>) {
    let kept = session.lock().unwrap().take();
    if let Some(s) = kept {
        let _ = s.close().await;
    }
}

/// Whether a term's grant ended by the choice of the term's own code: released (resigned,
/// dropped), or its session closed. Nothing else closes the session during a term (the
/// supervisor holds a handle of it), but its heartbeat task gone (a panic, its runtime shut
/// down), which is a loss.
fn ended_by_the_work(reason: LostReason, session: &Session) -> bool {
    use std::sync::atomic::Ordering;
    match reason {
        LostReason::Released => true,
        LostReason::Session(SessionEnd::Closed) => {
            !session.shared().orphaned.load(Ordering::SeqCst)
        }
        _ => false,
    }
}
