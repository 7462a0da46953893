//! The undo of an acquisition: what an attempt may have created on the cluster, removed now or
//! handed to the session's background task when the attempt is dropped before it is settled.

use std::sync::Arc;

use tokio::time::Instant;
use uuid::Uuid;

use crate::backend::{Entry, EntryKind, QueueId};
use crate::retry::Retry;
use crate::session::{Cleanup, EnqueueAllTask, EnqueueTask, InFlight, LocalSlot, Shared, Undo};
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
    /// What an undo in progress has still to do (see [`cleanup_now`](Self::cleanup_now)).
    pub(super) undoing: Option<Undo>,
}

impl Pending {
    /// What this attempt leaves on the cluster, if anything (taken: the attempt is settled).
    fn take_undo(&mut self) -> Option<Undo> {
        // Every granted acquisition drops its settled `Pending`: the queue is cloned only when
        // something is left.
        if let Some(undo) = self.undoing.take() {
            return Some(undo);
        }
        if !(self.entry.is_some() || self.inflight.is_some() || self.maybe_created) {
            return None;
        }
        let (queue, kind, attempt) = (self.queue.clone(), self.kind, self.attempt);
        if let Some(entry) = self.entry.take() {
            // The entry an earlier failed try may have created is this one (a retry finds it
            // again): once it is removed, there is nothing left to abandon.
            self.maybe_created = false;
            Some(Undo::Remove { queue, entry })
        } else if let Some(inflight) = self.inflight.take() {
            Some(Undo::Enqueued {
                queue,
                kind,
                attempt,
                inflight,
            })
        } else if std::mem::take(&mut self.maybe_created) {
            Some(Undo::Abandon {
                queue,
                kind,
                attempt,
            })
        } else {
            None
        }
    }

    /// Removes what this attempt created *now* and confirms it (`try_lock` and `lock_timeout`
    /// promise that no entry is left when they return). Falls back to the background task if
    /// that is cancelled; a permanent error (a delete the cluster refuses) is returned, the
    /// caller's answer then, since the promise does not hold.
    pub(super) async fn cleanup_now(mut self) -> Result<()> {
        self.undoing = self.take_undo();
        undo_now(&self.shared, &mut self.undoing).await
        // Drop hands off anything left.
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(undo) = self.take_undo() {
            let locals = self.local.take().into_iter().collect();
            self.shared.hand_off(Cleanup::Undo { undo, locals });
        }
    }
}

/// Carries out `left` now, each request retried while the session lives; a lost session takes
/// what is left with it. What fails stays in `left` for the background task, and a permanent
/// failure is returned; so is the session's loss if it came before the undo was done (a
/// `lock_timeout` whose cluster went silent during its wait, its session lost while the
/// removal went unanswered: "timed out" would tell its caller that someone else held the
/// lock, where the cluster was out of reach and the entry is left to the session's expiry).
async fn undo_now(shared: &Shared, left: &mut Option<Undo>) -> Result<()> {
    let again = |e: &Error| e.is_temporary() && shared.end().is_none();
    let retry = || Retry::new(shared.backoff()).counted(shared.backend_name());
    let undo = Undo::carry_out(left, &*shared.remote, retry, again);
    let done = shared.unless_lost(undo).await;
    if let Some(end) = shared.end() {
        *left = None;
        return match done {
            Ok(Ok(())) => Ok(()),
            _ => Err(Error::SessionLost(end)),
        };
    }
    done?
}

/// An all-or-nothing acquisition in progress (see [`acquire_all`](super::acquire_all)); dropped before it is
/// settled, it hands the removal of whatever it may have created to the background task.
pub(super) struct PendingAll {
    pub(super) shared: Arc<Shared>,
    pub(super) queues: Vec<(QueueId, Uuid)>,
    pub(super) inflight: Option<EnqueueAllTask>,
    pub(super) maybe_created: bool,
    pub(super) locals: Vec<LocalSlot>,
    /// What an undo in progress has still to do (see [`abandon_now`](Self::abandon_now)).
    pub(super) undoing: Option<Undo>,
}

impl PendingAll {
    /// What this attempt leaves on the cluster, if anything (taken: the attempt is settled).
    fn take_undo(&mut self) -> Option<Undo> {
        if let Some(undo) = self.undoing.take() {
            return Some(undo);
        }
        let inflight = self.inflight.take();
        let maybe_created = std::mem::take(&mut self.maybe_created);
        (inflight.is_some() || maybe_created).then(|| Undo::EnqueuedAll {
            queues: std::mem::take(&mut self.queues),
            inflight,
            maybe_created,
        })
    }

    /// Abandons every attempt *now* (an earlier try may have created entries that the last
    /// answer does not report), so that `try_lock` leaves nothing when it returns. Falls back
    /// to the background task (on drop) if that is cancelled; a permanent error is returned.
    pub(super) async fn abandon_now(&mut self) -> Result<()> {
        self.undoing = self.take_undo();
        undo_now(&self.shared, &mut self.undoing).await
    }
}

impl Drop for PendingAll {
    fn drop(&mut self) {
        // (No task is spawned here: a drop may happen outside any runtime.)
        if let Some(undo) = self.take_undo() {
            let locals = std::mem::take(&mut self.locals);
            self.shared.hand_off(Cleanup::Undo { undo, locals });
        }
    }
}

/// Sends a create per try (`send`, told whether an earlier try may have created something),
/// kept in `inflight` while it runs (see [`InFlight`]), and retries temporary errors until
/// `deadline` (the last error then) or the session is lost. Sets `maybe_created` when a failed
/// try may have created something: any failure but a request refused before it was sent.
pub(super) async fn create<T: Send + 'static>(
    shared: &Shared,
    inflight: &mut Option<InFlight<T>>,
    maybe_created: &mut bool,
    deadline: Option<Instant>,
    op: &'static str,
    mut send: impl FnMut(bool) -> InFlight<T>,
) -> Result<T> {
    let mut state = (shared, inflight, maybe_created);
    let tries = Retry::new(shared.backoff())
        .until(deadline)
        .counted(shared.backend_name())
        .run_with(
            &mut state,
            |(shared, inflight, maybe_created)| {
                let task = shared.check_alive().map(|()| send(**maybe_created));
                Box::pin(async move {
                    let answer = answer_of(shared, inflight, task?, maybe_created, op).await?;
                    answer.inspect_err(|e| {
                        **maybe_created |= !matches!(
                            e,
                            Error::InvalidName(_)
                                | Error::InvalidConfig(_)
                                | Error::InvalidValue(_)
                        );
                    })
                })
            },
            Error::is_temporary,
        );
    // Pauses included: a lost session ends the wait at once.
    shared.noted(shared.unless_lost(tries).await?)
}

/// Awaits a create in flight, kept in `slot` meanwhile (so that a drop of the attempt hands it
/// to the background task), unless the session is lost. A request that ended without an
/// answer (it panicked) may have created something: `maybe_created` is set, and the error is
/// permanent.
async fn answer_of<T>(
    shared: &Shared,
    slot: &mut Option<InFlight<T>>,
    task: InFlight<T>,
    maybe_created: &mut bool,
    op: &'static str,
) -> Result<Result<T>> {
    let inflight = slot.insert(task);
    let answer = shared.unless_lost(inflight).await?;
    *slot = None;
    answer.map_err(|_panic| {
        *maybe_created = true;
        Error::backend(shared.backend_name(), op, false, "the request panicked")
    })
}
