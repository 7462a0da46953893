//! The end signal of a held tenure.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::Notify;

use crate::backend::QueueId;
use crate::session::{LocalSlot, LostReason, Shared};

/// Why a tenure ended, once known, and a wake-up for those awaiting it: the first reason
/// recorded stands. One per held lock, so kept small: a `tokio::sync::watch` channel would do
/// the same but costs ~340 bytes (its eight notifiers), a third of a held lock's memory.
///
/// It also keeps the tenure's slot in its session's local queue (what keeps the session's
/// other acquirers of the same queue waiting): shared with the `lost()` futures, which free it
/// as soon as they see the entry deleted.
#[derive(Default)]
pub(super) struct Ended {
    reason: StdMutex<Option<LostReason>>,
    notify: Notify,
    local: StdMutex<Option<LocalSlot>>,
    /// Its entry was removed by the `lost()` that found the grant superseded: the release, or
    /// the drop, must not remove it again (on Redis, that counted the entry's name out twice,
    /// the second time the name of the session's next entry of the lock, which a
    /// reconciliation then deleted as a released entry come back, while it was held).
    removed: AtomicBool,
}

impl Ended {
    /// An end signal keeping `local`.
    pub(super) fn keeping(local: Option<LocalSlot>) -> Self {
        Ended {
            local: StdMutex::new(local),
            ..Ended::default()
        }
    }

    /// The local slot, taken (`None` once taken).
    pub(super) fn take_local(&self) -> Option<LocalSlot> {
        self.local.lock().unwrap().take()
    }

    /// Records that the entry was removed (see [`Ended::removed`]).
    pub(super) fn set_removed(&self) {
        self.removed.store(true, Ordering::SeqCst);
    }

    /// Whether the entry was removed already (see [`Ended::set_removed`]).
    pub(super) fn removed(&self) -> bool {
        self.removed.load(Ordering::SeqCst)
    }

    pub(super) fn get(&self) -> Option<LostReason> {
        *self.reason.lock().unwrap()
    }

    /// Records `reason` unless an earlier one is recorded already; true if this one was.
    pub(super) fn first(&self, reason: LostReason) -> bool {
        {
            let mut r = self.reason.lock().unwrap();
            if r.is_some() {
                return false;
            }
            *r = Some(reason);
        }
        self.notify.notify_waiters();
        true
    }

    /// The reason, once one is recorded.
    pub(super) async fn wait(&self) -> LostReason {
        loop {
            // Created before the check: `notify_waiters` wakes it even if not polled yet.
            let notified = self.notify.notified();
            if let Some(r) = self.get() {
                return r;
            }
            notified.await;
        }
    }
}

/// Ends a tenure whose entry was found deleted (or its grant gone, `why`): for the session's
/// reason if it has one (a session that is closing or expiring deletes its entries too), for
/// `why` otherwise. The reason the tenure ended with (an earlier one, if it had ended already).
///
/// Its local slot goes at once: nothing of it is left on the cluster to wait for, and the
/// session's next acquisition of the queue (a campaign again, while the lost leadership is
/// still alive) waited behind the slot until the leadership was dropped, or for ever.
pub(super) fn ended_by(
    ended: &Ended,
    shared: Option<&Arc<Shared>>,
    queue: &QueueId,
    why: LostReason,
) -> LostReason {
    let reason = mark_ended(ended, shared, why);
    drop(ended.take_local());
    if let Some(shared) = shared {
        shared.local.trim(queue);
    }
    ended.get().unwrap_or(reason)
}

/// Records the end of a tenure for `why`, or for its session's reason if it has one (see
/// [`ended_by`]), without freeing its local slot; the reason it ended for.
pub(super) fn mark_ended(
    ended: &Ended,
    shared: Option<&Arc<Shared>>,
    why: LostReason,
) -> LostReason {
    let session_end = shared.and_then(|s| s.end());
    let reason = session_end.map_or(why, LostReason::Session);
    if ended.first(reason) {
        crate::metrics::grant_lost(reason);
    }
    reason
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_first_end_stands_and_wakes_every_waiter() {
        let ended = Arc::new(Ended::default());
        assert_eq!(ended.get(), None);
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let e = ended.clone();
                tokio::spawn(async move { e.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert!(ended.first(LostReason::EntryDeleted));
        assert!(!ended.first(LostReason::Released));
        for w in waiters {
            let r = tokio::time::timeout(Duration::from_secs(5), w).await;
            assert_eq!(r.unwrap().unwrap(), LostReason::EntryDeleted);
        }
        // Awaited after the end: at once.
        assert_eq!(ended.wait().await, LostReason::EntryDeleted);
    }
}
