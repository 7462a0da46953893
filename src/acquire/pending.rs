//! The undo of an acquisition: what an attempt may have created on the cluster, removed now or
//! handed to the session's background task when the attempt is dropped before it is settled.

use std::sync::Arc;

use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::backend::{Entry, EntryKind, QueueId};
use crate::session::{Cleanup, EnqueueAllTask, EnqueueTask, LocalSlot, Shared};
use crate::{Error, Result};

/// An acquisition in progress. If it is dropped before it becomes a [`Tenure`](crate::tenure::Tenure) (a cancelled
/// future, an error, a timeout), it hands the removal of whatever it may have created to the
/// session's background task, together with the local queue slot, so that the next local waiter
/// cannot start before the remote entry is gone.
pub(super) struct Pending {
    pub(super) shared: Arc<Shared>,
    pub(super) queue: QueueId,
    pub(super) kind: EntryKind,
    pub(super) attempt: Uuid,
    /// The create request in flight (see [`EnqueueTask`]).
    pub(super) inflight: Option<EnqueueTask>,
    /// An earlier try failed in flight: it may have created an entry.
    pub(super) maybe_created: bool,
    pub(super) entry: Option<Entry>,
    pub(super) local: Option<LocalSlot>,
}

impl Pending {
    pub(super) fn take_cleanup(&mut self) -> Option<Cleanup> {
        let local = self.local.take();
        let (queue, kind, attempt) = (self.queue.clone(), self.kind, self.attempt);
        if let Some(entry) = self.entry.take() {
            Some(Cleanup::Remove {
                queue,
                entry,
                local,
            })
        } else if let Some(inflight) = self.inflight.take() {
            Some(Cleanup::Enqueued {
                queue,
                kind,
                attempt,
                inflight,
                local,
            })
        } else if std::mem::take(&mut self.maybe_created) {
            Some(Cleanup::Abandon {
                queue,
                kind,
                attempt,
                local,
            })
        } else {
            None
        }
    }

    /// Removes what this attempt created *now* and confirms it (`try_lock` and `lock_timeout`
    /// promise that no entry is left when they return). Falls back to the background task if
    /// that fails or is cancelled.
    pub(super) async fn cleanup_now(mut self) {
        if let Some(inflight) = self.inflight.as_mut() {
            let answer = inflight.await;
            self.inflight = None;
            match answer {
                Ok(Ok(enqueued)) => self.entry = Some(enqueued.entry),
                _ => self.maybe_created = true,
            }
        }
        let shared = self.shared.clone();
        let remote = shared.remote.clone();
        let res = if let Some(entry) = &self.entry {
            shared.retry(|| remote.remove(entry)).await.map(drop)
        } else if self.maybe_created {
            let (queue, kind, attempt) = (&self.queue, self.kind, self.attempt);
            shared.retry(|| remote.abandon(queue, kind, attempt)).await
        } else {
            Ok(())
        };
        if res.is_ok() || shared.end().is_some() {
            self.entry = None;
            self.maybe_created = false;
        }
        // Drop hands off anything left.
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(work) = self.take_cleanup() {
            self.shared.hand_off(work);
        }
    }
}

/// An all-or-nothing acquisition in progress (see [`acquire_all`](super::acquire_all)); dropped before it is
/// settled, it hands the removal of whatever it may have created to the background task.
pub(super) struct PendingAll {
    pub(super) shared: Arc<Shared>,
    pub(super) queues: Vec<(QueueId, Uuid)>,
    pub(super) inflight: Option<EnqueueAllTask>,
    pub(super) maybe_created: bool,
    pub(super) locals: Vec<LocalSlot>,
}

impl Drop for PendingAll {
    fn drop(&mut self) {
        let inflight = self.inflight.take();
        if inflight.is_none() && !self.maybe_created {
            return;
        }
        // With `maybe_created`, an earlier try may have created entries and no reply says
        // which: every attempt is abandoned. (No task is spawned here: a drop may happen
        // outside any runtime.)
        self.shared.hand_off(Cleanup::EnqueuedAll {
            queues: std::mem::take(&mut self.queues),
            inflight,
            maybe_created: self.maybe_created,
            locals: std::mem::take(&mut self.locals),
        });
    }
}

impl PendingAll {
    /// Abandons every attempt *now* (an earlier try may have created entries that the last
    /// answer does not report), so that `try_lock` leaves nothing when it returns. Falls back to
    /// the background task (on drop) if that fails.
    pub(super) async fn abandon_now(&mut self) {
        let remote = self.shared.remote.clone();
        for (queue, attempt) in &self.queues {
            let res = self
                .shared
                .retry(|| remote.abandon(queue, EntryKind::Exclusive, *attempt))
                .await;
            if res.is_err() && self.shared.end().is_none() {
                return;
            }
        }
        self.maybe_created = false;
    }
}

/// Awaits a create sent as a task of its own, kept in `slot` meanwhile (so that a drop of the
/// attempt hands it to the background task), unless the session is lost. A task that ended
/// without an answer (it panicked) may have created something: `maybe_created` is set, and the
/// error is permanent.
pub(super) async fn answer_of<T>(
    shared: &Shared,
    slot: &mut Option<JoinHandle<Result<T>>>,
    task: JoinHandle<Result<T>>,
    maybe_created: &mut bool,
    op: &'static str,
) -> Result<Result<T>> {
    let inflight = slot.insert(task);
    let answer = shared.unless_lost(inflight).await?;
    *slot = None;
    answer.map_err(|join| {
        *maybe_created = true;
        Error::backend(shared.backend_name(), op, false, join.to_string())
    })
}
