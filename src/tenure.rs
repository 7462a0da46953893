//! A held tenure: the granted entry behind every guard and leadership, its loss signal and
//! its release.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info_span, Instrument};

use crate::backend::{ArmedWatch, BackendSession, Entry, QueueId};
use crate::race::{race, First};
use crate::retry::Backoff;
use crate::session::{Cleanup, LocalSlot, LostReason, Shared};
use crate::{Error, FencingToken, Result, Session};

/// A granted entry. Keeps no task and no watch of its own: its entry is watched only while
/// someone awaits [`lost`](Self::lost).
pub(crate) struct Tenure {
    pub(crate) session: Session,
    pub(crate) queue: QueueId,
    pub(crate) entry: Entry,
    granted_at: Instant,
    local: StdMutex<Option<LocalSlot>>,
    released: AtomicBool,
    /// Why the tenure ended, once known here (released, or its deletion seen by a `lost()`).
    ended: Arc<watch::Sender<Option<LostReason>>>,
    /// The watch the backend armed during the enqueue, for the first `lost()` to use.
    armed: Arc<StdMutex<Option<ArmedWatch>>>,
}

impl Tenure {
    pub(crate) fn new(
        session: Session,
        queue: QueueId,
        entry: Entry,
        local: Option<LocalSlot>,
        armed: Option<ArmedWatch>,
    ) -> Self {
        Tenure {
            session,
            queue,
            entry,
            granted_at: Instant::now(),
            local: StdMutex::new(local),
            released: AtomicBool::new(false),
            ended: Arc::new(watch::channel(None).0),
            armed: Arc::new(StdMutex::new(armed)),
        }
    }

    pub(crate) fn token(&self) -> FencingToken {
        self.entry.token
    }

    /// How long ago the grant was made.
    pub(crate) fn held_for(&self) -> Duration {
        self.granted_at.elapsed()
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        (*self.ended.borrow()).or_else(|| self.session.shared().end().map(LostReason::Session))
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lost_reason().is_none()
    }

    /// Resolves when the tenure ends: released, its session lost, or its entry deleted. The
    /// entry is watched on the cluster only while this future is polled.
    pub(crate) fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut ended = self.ended.subscribe();
        let ended_tx = self.ended.clone();
        let shared = self.session.shared();
        let session_lost = shared.lost();
        let weak = Arc::downgrade(shared);
        let remote = shared.remote.clone();
        let entry = self.entry.clone();
        let armed = self.armed.clone();
        async move {
            let here = async {
                let reason = ended.wait_for(Option::is_some).await.ok().and_then(|v| *v);
                match reason {
                    Some(r) => r,
                    None => std::future::pending().await,
                }
            };
            let known = race(here, session_lost);
            match race(known, own_entry_gone(remote, entry, armed, weak.clone())).await {
                First::Left(First::Left(r)) => r,
                First::Left(First::Right(end)) => LostReason::Session(end),
                First::Right(()) => {
                    // A session that is closing or expiring deletes its entries too: report
                    // the session's reason when it has one.
                    let reason = weak
                        .upgrade()
                        .and_then(|s| s.end())
                        .map_or(LostReason::EntryDeleted, LostReason::Session);
                    ended_tx.send_if_modified(|v| {
                        v.is_none() && {
                            *v = Some(reason);
                            true
                        }
                    });
                    let recorded = *ended_tx.borrow();
                    recorded.unwrap_or(reason)
                }
            }
        }
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
        self.ended.send_if_modified(|v| {
            v.is_none() && {
                *v = Some(LostReason::Released);
                true
            }
        });
        let shared = self.session.shared();
        let span = info_span!(parent: &shared.span, "release", key = %self.entry.key, token = %self.entry.token);
        let remote = shared.remote.clone();
        let res = shared
            .retry(|| remote.remove(&self.entry))
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
            (Ok(false), None) => {
                self.drop_local();
                Err(Error::NotHeld(LostReason::EntryDeleted))
            }
            (Err(Error::SessionLost(end)), None) => {
                self.drop_local();
                Err(Error::NotHeld(LostReason::Session(end)))
            }
            (Err(e), None) => Err(e), // Drop hands the removal to the background task.
        }
    }

    fn drop_local(&self) {
        let local = self.local.lock().unwrap().take();
        drop(local);
        self.session.shared().trim_local_queue(&self.queue);
    }
}

/// Resolves once `entry` is gone, retrying temporary errors. Never resolves if the entry
/// cannot be watched (a permanent error) or the session is gone: the session's own loss
/// covers those.
async fn own_entry_gone(
    remote: Arc<dyn BackendSession>,
    entry: Entry,
    armed: Arc<StdMutex<Option<ArmedWatch>>>,
    session: Weak<Shared>,
) {
    let armed = armed.lock().unwrap().take();
    if let Some(armed) = armed {
        armed.await;
    }
    let mut backoff = Backoff::new();
    loop {
        match remote.wait_own_gone(&entry).await {
            Ok(()) => return,
            Err(e) if e.is_temporary() && session.upgrade().is_some_and(|s| s.end().is_none()) => {
                debug!(error = %e, "watching our entry failed, retrying");
                backoff.pause().await;
            }
            Err(e) => {
                debug!(error = %e, "cannot watch our entry");
                return std::future::pending().await;
            }
        }
    }
}

impl Drop for Tenure {
    fn drop(&mut self) {
        let local = self.local.get_mut().unwrap().take();
        if local.is_some() {
            // Never blocks, needs no runtime: the background task deletes the entry, then
            // lets the next local waiter go.
            self.session.shared().hand_off(Cleanup::Remove {
                queue: self.queue.clone(),
                entry: self.entry.clone(),
                local,
            });
        }
    }
}
