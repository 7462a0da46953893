//! A held tenure: the granted entry behind every guard and leadership, its loss signal and
//! its release.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info_span, Instrument};

use crate::backend::{BackendSession, Entry, EntryKind, QueueId};
use crate::race::{race, First};
use crate::retry::{Backoff, Retry};
use crate::session::{Cleanup, LocalSlot, LostReason, Shared, Undo};
use crate::{Error, FencingToken, Result, Session};

mod ended;
mod hold;
use ended::{ended_by, mark_ended, Ended};
pub(crate) use hold::Hold;

/// A granted entry. Keeps no task and no watch of its own: its entry is watched only while
/// someone awaits [`lost`](Self::lost).
pub(crate) struct Tenure {
    pub(crate) session: Session,
    pub(crate) queue: QueueId,
    pub(crate) entry: Entry,
    granted_at: Instant,
    released: AtomicBool,
    /// The entry's removal is done, or handed to the background task: the drop has nothing
    /// left to do.
    settled: AtomicBool,
    /// Shares held (see [`Hold`]).
    holds: AtomicUsize,
    /// Why the tenure ended, once known here (released, or its deletion seen by a `lost()`),
    /// and its local slot.
    ended: Arc<Ended>,
    /// Whether its hold is recorded in the metrics (not a semaphore's gate).
    recorded: bool,
    /// Whether its grant had to wait for another holder.
    waited: bool,
    /// What its grant rule looks at ahead of it (a kind, if one, and how many of the nearest;
    /// granted while fewer are there): re-checked after a failover (see
    /// [`BackendSession::wait_grant_lost`]).
    window: (Option<EntryKind>, usize),
}

impl Tenure {
    pub(crate) fn new(
        session: Session,
        queue: QueueId,
        entry: Entry,
        local: Option<LocalSlot>,
    ) -> Self {
        Tenure {
            session,
            queue,
            entry,
            granted_at: Instant::now(),
            released: AtomicBool::new(false),
            settled: AtomicBool::new(false),
            holds: AtomicUsize::new(0),
            ended: Arc::new(Ended::keeping(local)),
            recorded: true,
            waited: false,
            window: (None, 1),
        }
    }

    /// The same, granted by a rule that looks at `window` ahead of it (see
    /// [`BackendSession::still_ahead`]); an exclusive entry's, nothing ahead, by default.
    pub(crate) fn with_window(mut self, window: (Option<EntryKind>, usize)) -> Self {
        self.window = window;
        self
    }

    /// The same, saying whether its grant had to wait for another holder.
    pub(crate) fn with_waited(mut self, waited: bool) -> Self {
        self.waited = waited;
        self
    }

    /// Whether its grant had to wait for another holder.
    pub(crate) fn waited(&self) -> bool {
        self.waited
    }

    /// The same, its hold not recorded in the metrics (a semaphore's gate).
    pub(crate) fn unrecorded(mut self) -> Self {
        self.recorded = false;
        self
    }

    pub(crate) fn token(&self) -> FencingToken {
        self.entry.token
    }

    /// How long ago the grant was made.
    pub(crate) fn held_for(&self) -> Duration {
        self.granted_at.elapsed()
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.ended
            .get()
            .or_else(|| self.session.shared().end().map(LostReason::Session))
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lost_reason().is_none()
    }

    /// Resolves when the tenure ends: released, its session lost, or its entry deleted. The
    /// entry is watched on the cluster only while this future is polled.
    pub(crate) fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let ended = self.ended.clone();
        let shared = self.session.shared();
        let session_lost = shared.lost();
        let weak = Arc::downgrade(shared);
        let remote = shared.remote.clone();
        let (entry, queue, window) = (self.entry.clone(), self.queue.clone(), self.window);
        async move {
            let here = ended.wait();
            let known = race(here, session_lost);
            let gone = grant_lost(
                remote.clone(),
                entry.clone(),
                queue.clone(),
                window,
                weak.clone(),
            );
            match race(known, gone).await {
                First::Left(First::Left(r)) => r,
                First::Left(First::Right(end)) => LostReason::Session(end),
                First::Right(why) => {
                    if why == LostReason::Superseded {
                        // Ended at once (`is_held` says so: the command's tree is killed).
                        // Still in its queue, behind others: removed before its local slot
                        // goes, or the session's next acquisition of the lock would find it
                        // again (its name repeats), and this grant's release delete that.
                        mark_ended(&ended, weak.upgrade().as_ref(), why);
                        let backoff = weak.upgrade().map_or_else(Backoff::new, |s| s.backoff());
                        let removed = Retry::new(backoff)
                            .run(|| remote.remove(&entry), |e| worth_retrying(e, &weak))
                            .await;
                        if matches!(removed, Ok(_) | Err(Error::NotHeld(_))) {
                            ended.set_removed();
                        }
                    }
                    ended_by(&ended, weak.upgrade().as_ref(), &queue, why)
                }
            }
        }
    }

    /// The entry was found deleted by someone else (a guarded write refused): the tenure ends
    /// now, as a `lost()` would have ended it, and `is_held()` says so. The reason it ended
    /// with.
    pub(crate) fn found_deleted(&self) -> LostReason {
        ended_by(
            &self.ended,
            Some(self.session.shared()),
            &self.queue,
            LostReason::EntryDeleted,
        )
    }

    /// Fails unless the entry is still held.
    pub(crate) fn check_held(&self) -> Result<()> {
        match self.lost_reason() {
            None => Ok(()),
            Some(r) => Err(Error::NotHeld(r)),
        }
    }

    /// Deletes the entry and confirms it; a second call fails with
    /// [`Error::NotHeld`]`(`[`LostReason::Released`]`)`.
    pub(crate) async fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Err(Error::NotHeld(LostReason::Released));
        }
        let lost_before = self.lost_reason();
        // A release of a grant already lost (its session past the local deadline, its entry
        // deleted) ends it for that reason, not as a choice of its owner's.
        self.ended
            .first(lost_before.unwrap_or(LostReason::Released));
        if let (true, Some(r)) = (self.ended.removed(), lost_before) {
            self.drop_local();
            return Err(Error::NotHeld(r));
        }
        let shared = self.session.shared();
        let span = info_span!(parent: &shared.span, "release", key = %self.entry.key, token = %self.entry.token);
        let remote = shared.remote.clone();
        // Whether a try failed without an answer: it may have removed the entry all the same.
        let unanswered = AtomicBool::new(false);
        let res = shared
            .retry(|| {
                let removing = remote.remove(&self.entry);
                let unanswered = &unanswered;
                async move {
                    let r = removing.await;
                    if r.as_ref().is_err_and(Error::is_temporary) {
                        unanswered.store(true, Ordering::SeqCst);
                    }
                    r
                }
            })
            .instrument(span)
            .await;
        match (res, lost_before) {
            (Ok(true), None) => {
                self.drop_local();
                Ok(())
            }
            (_, Some(r)) => {
                self.drop_local();
                Err(Error::NotHeld(r))
            }
            // Gone at the retry after a try that got no answer (a member that hung, a leader
            // that died with the reply): most likely that try removed it. Reporting
            // `EntryDeleted` would blame someone else for our own release.
            (Ok(false), None) if unanswered.load(Ordering::SeqCst) => {
                self.drop_local();
                Ok(())
            }
            (Ok(false), None) => {
                self.drop_local();
                Err(Error::NotHeld(LostReason::EntryDeleted))
            }
            // The backend knows why the entry is gone (Redis: a failover lost it).
            (Err(Error::NotHeld(r)), None) => {
                self.drop_local();
                Err(Error::NotHeld(r))
            }
            (Err(Error::SessionLost(end)), None) => {
                self.drop_local();
                Err(Error::NotHeld(LostReason::Session(end)))
            }
            (Err(e), None) => Err(e), // Drop hands the removal to the background task.
        }
    }

    fn drop_local(&self) {
        self.settled.store(true, Ordering::SeqCst);
        self.record_end();
        drop(self.ended.take_local());
        self.session.shared().local.trim(&self.queue);
    }
}

/// Resolves once `entry`'s grant is gone (see [`BackendSession::wait_grant_lost`]), with the
/// reason, retrying temporary errors. Never resolves if the entry cannot be watched (a
/// permanent error) or the session is gone: the session's own loss covers those.
async fn grant_lost(
    remote: Arc<dyn BackendSession>,
    entry: Entry,
    queue: QueueId,
    (kind, nearest): (Option<EntryKind>, usize),
    session: Weak<Shared>,
) -> LostReason {
    let backoff = session.upgrade().map_or_else(Backoff::new, |s| s.backoff());
    let watched = Retry::new(backoff)
        .run(
            || remote.wait_grant_lost(&entry, &queue, kind, nearest),
            |e| worth_retrying(e, &session),
        )
        .await;
    match watched {
        Ok(why) => why,
        Err(e) => {
            debug!(error = %e, "cannot watch our entry");
            // The session's own loss ends the wait, recorded now if this is its report.
            if let Some(s) = session.upgrade() {
                s.note(&e);
            }
            std::future::pending().await
        }
    }
}

/// Whether a failed watch of our entry is worth another try: a temporary error while the
/// session lives.
fn worth_retrying(e: &Error, session: &Weak<Shared>) -> bool {
    e.is_temporary() && session.upgrade().is_some_and(|s| s.end().is_none())
}

impl Tenure {
    /// Resolves when someone asks this holder to let go (a revocation request written into
    /// its entry); never while nobody does, nor after the entry is gone.
    pub(crate) fn revoke_requested(&self) -> impl Future<Output = ()> + Send + 'static {
        let shared = self.session.shared();
        let remote = shared.remote.clone();
        let weak = Arc::downgrade(shared);
        let entry = self.entry.clone();
        let backoff = shared.backoff();
        async move {
            let watched = Retry::new(backoff)
                .run(|| remote.wait_revoke(&entry), |e| worth_retrying(e, &weak))
                .await;
            if watched.is_err() {
                std::future::pending().await
            }
        }
    }

    /// Hands the release to the session's background task (the last hold was dropped), unless
    /// a release settled it already.
    fn hand_off_release(&self) {
        if self.settled.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.ended.removed() {
            // Removed by the `lost()` that found it superseded.
            self.drop_local();
            return;
        }
        // Dropping the grant releases it: a pending `lost()` reports that (rather than the
        // deletion it would see next), unless the grant was lost already.
        if self.session.shared().end().is_none() {
            self.ended.first(LostReason::Released);
        }
        self.record_end();
        let local = self.ended.take_local();
        // Never blocks, needs no runtime: the background task deletes the entry, then lets
        // the next local waiter go (if the primitive has a local queue).
        self.session.shared().hand_off(Cleanup::Undo {
            undo: Undo::Remove {
                queue: self.queue.clone(),
                entry: self.entry.clone(),
            },
            locals: local.into_iter().collect(),
        });
    }

    /// Records how long this grant was held.
    fn record_end(&self) {
        if !self.recorded {
            return;
        }
        let shared = self.session.shared();
        let name = shared.metrics_names.then_some(self.queue.name.as_str());
        crate::metrics::tenure_ended(
            crate::metrics::primitive(&self.queue, self.entry.kind),
            name,
            self.granted_at.elapsed(),
        );
    }
}

impl Drop for Tenure {
    fn drop(&mut self) {
        self.hand_off_release();
    }
}

/// The methods every guard kind shares, delegating to its `hold: Hold` field.
macro_rules! holding_methods {
    ($what:literal) => {
        /// The fencing token of this grant: larger than that of every earlier holder it
        /// excludes. Send it with every write to the protected resource.
        pub fn token(&self) -> $crate::FencingToken {
            self.hold.tenure().token()
        }

        /// The key or node path of our entry on the cluster.
        pub fn key(&self) -> &str {
            &self.hold.tenure().entry.key
        }

        /// How long this grant has been held.
        pub fn held_for(&self) -> std::time::Duration {
            self.hold.tenure().held_for()
        }

        /// The session this grant belongs to.
        pub fn session(&self) -> &$crate::Session {
            &self.hold.tenure().session
        }

        #[doc = concat!("Whether the ", $what, " is still held as far as this process can tell")]
        /// (false past the local deadline even while the cluster is unreachable).
        pub fn is_held(&self) -> bool {
            self.hold.is_held()
        }

        #[doc = concat!("Resolves when the ", $what, " is lost: the session ended (the cluster")]
        /// expired it, the local deadline passed without a confirmed heartbeat, or it was
        /// closed), our entry was deleted by someone else, or it was released.
        ///
        /// Deletion by someone else is watched on the cluster only while a `lost()` future is
        /// polled (a held grant costs no server watch otherwise); the session's own loss is
        /// always known. A cluster that refuses the watch for good (the role lost its read
        /// permission) leaves a deletion unseen: only the session's loss or a release then
        /// resolves it (fence your writes).
        pub fn lost(
            &self,
        ) -> impl std::future::Future<Output = $crate::LostReason> + Send + 'static {
            self.hold.lost()
        }

        /// Resolves when someone asks this holder to let go (a revocation request, see
        /// `request_revoke`); the holder decides what to do. Watched on the cluster only while
        /// polled.
        pub fn revoke_requested(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
            self.hold.tenure().revoke_requested()
        }

        #[doc = concat!("Releases the ", $what, " and waits for the cluster to confirm. Never")]
        /// deletes another holder's entry. Fails with
        /// [`Error::NotHeld`](crate::Error::NotHeld) and the reason if it was already
        /// released or lost (its entry deleted, its session ended).
        ///
        /// # Cancel safety
        ///
        /// Dropping the future ends the tenure all the same: from the first poll the grant
        /// counts as released (a second call fails with `NotHeld(Released)`), and if the
        /// removal did not complete, the session's background task removes the entry when
        /// the guard is dropped ([`Session::flush`](crate::Session::flush) waits for it).
        pub async fn release(&self) -> $crate::Result<()> {
            self.hold.release().await
        }
    };
}
pub(crate) use holding_methods;

/// What every grant offers (a mutex guard, a read or write guard, a permit, a leadership, a
/// multi-lock's guards): for code generic over them, such as a guarded write that compares the
/// holder's entry (`fencelock_etcd::ownership`).
pub trait Holding {
    /// The fencing token of the grant.
    fn token(&self) -> FencingToken;
    /// The key or node path of the grant's entry on the cluster.
    fn key(&self) -> &str;
    /// Whether it is still held as far as this process can tell.
    fn is_held(&self) -> bool;
}

/// Implements [`Holding`] for a guard type with the inherent methods of [`holding_methods`].
macro_rules! impl_holding {
    ($t:ty) => {
        impl $crate::Holding for $t {
            fn token(&self) -> $crate::FencingToken {
                <$t>::token(self)
            }
            fn key(&self) -> &str {
                <$t>::key(self)
            }
            fn is_held(&self) -> bool {
                <$t>::is_held(self)
            }
        }
    };
}
pub(crate) use impl_holding;
