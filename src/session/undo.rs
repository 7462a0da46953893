//! Undoing an attempt: what an acquisition (or a released grant) leaves on the cluster, and
//! the one procedure that takes it back. An acquisition runs it inline (`try_lock` and
//! `lock_timeout` promise to leave nothing when they return); a drop hands it to the session's
//! background task (`cleanup.rs`), which runs the same procedure.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use uuid::Uuid;

use crate::backend::{BackendSession, Enqueued, Entry, EntryKind, QueueId};
use crate::retry::Retry;
use crate::{Error, Result};

/// A create request in flight, polled by the acquisition that sent it and, should that be
/// dropped first, by whoever cleans up after it: dropping the acquisition cannot cut the
/// request off half way, so the cleanup awaits its answer and knows exactly what was created.
/// A panic inside it is an answer too (`Err`), as a task's would be. (Polled where it was sent,
/// not spawned as a task: a task per request woke another worker thread per acquisition.)
pub(crate) type InFlight<T> = BoxFuture<'static, std::thread::Result<Result<T>>>;

/// The request `f` in flight (see [`InFlight`]), to be polled from now on.
pub(crate) fn in_flight<T>(f: impl Future<Output = Result<T>> + Send + 'static) -> InFlight<T> {
    AssertUnwindSafe(f).catch_unwind().boxed()
}

/// An enqueue request in flight (see [`InFlight`]).
pub(crate) type EnqueueTask = InFlight<Enqueued>;

/// An all-or-nothing enqueue in flight (see [`InFlight`]).
pub(crate) type EnqueueAllTask = InFlight<Option<Vec<Entry>>>;

/// What is left on the cluster to take back.
pub(crate) enum Undo {
    /// This entry (guarded by its identity).
    Remove { queue: QueueId, entry: Entry },
    /// The create request still in flight: what it created, once it answers.
    Enqueued {
        queue: QueueId,
        kind: EntryKind,
        attempt: Uuid,
        inflight: EnqueueTask,
    },
    /// Whatever this attempt may have created (a try failed in flight: no reply says what).
    Abandon {
        queue: QueueId,
        kind: EntryKind,
        attempt: Uuid,
    },
    /// An all-or-nothing create: what the one in flight (if any) created. With
    /// `maybe_created`, an earlier try may have created entries that no reply reported:
    /// every attempt is abandoned, whatever the last answer says.
    EnqueuedAll {
        queues: Vec<(QueueId, Uuid)>,
        inflight: Option<EnqueueAllTask>,
        maybe_created: bool,
    },
}

impl Undo {
    /// The queues it touches: their local slots are freed once it is done.
    pub(crate) fn queues(&self) -> Vec<QueueId> {
        match self {
            Undo::Remove { queue, .. }
            | Undo::Enqueued { queue, .. }
            | Undo::Abandon { queue, .. } => vec![queue.clone()],
            Undo::EnqueuedAll { queues, .. } => queues.iter().map(|(q, _)| q.clone()).collect(),
        }
    }

    /// Carries out what `left` holds, each request retried by a loop from `retry` while
    /// `again` allows.
    /// `left` always holds what is still to do: `None` once done, the same or less after an
    /// error, and after a cancellation (so that a dropped inline undo can be handed to the
    /// background task without losing what it was about to remove).
    pub(crate) async fn carry_out(
        left: &mut Option<Undo>,
        remote: &dyn BackendSession,
        retry: impl Fn() -> Retry,
        again: impl Fn(&Error) -> bool + Copy,
    ) -> Result<()> {
        // A create in flight first: its answer says what there is to take back.
        match left {
            Some(Undo::Enqueued { inflight, .. }) => {
                let answer = inflight.await;
                let Some(Undo::Enqueued {
                    queue,
                    kind,
                    attempt,
                    ..
                }) = left.take()
                else {
                    unreachable!("matched above")
                };
                *left = Some(match answer {
                    Ok(Ok(enqueued)) => Undo::Remove {
                        queue,
                        entry: enqueued.entry,
                    },
                    _ => Undo::Abandon {
                        queue,
                        kind,
                        attempt,
                    },
                });
            }
            Some(Undo::EnqueuedAll {
                inflight: inflight @ Some(_),
                maybe_created,
                ..
            }) => {
                let answer = inflight.as_mut().expect("matched above").await;
                *inflight = None;
                // Created nothing, and no earlier try did: nothing to take back. Otherwise
                // every attempt is abandoned (which takes what each created, if anything).
                if matches!(answer, Ok(Ok(None))) && !*maybe_created {
                    *left = None;
                    return Ok(());
                }
                *maybe_created = true;
            }
            _ => {}
        }
        match left {
            None => Ok(()),
            Some(Undo::Remove { entry, .. }) => {
                match retry().run(|| remote.remove(entry), again).await {
                    // Gone, and the backend knows why (see `BackendSession::remove`): done.
                    Ok(_) | Err(Error::NotHeld(_)) => {}
                    Err(e) => return Err(e),
                }
                *left = None;
                Ok(())
            }
            Some(Undo::Abandon {
                queue,
                kind,
                attempt,
            }) => {
                let (queue, kind, attempt) = (&*queue, *kind, *attempt);
                retry()
                    .run(|| remote.abandon(queue, kind, attempt), again)
                    .await?;
                *left = None;
                Ok(())
            }
            Some(Undo::EnqueuedAll {
                maybe_created: false,
                ..
            }) => {
                *left = None;
                Ok(())
            }
            Some(Undo::EnqueuedAll { queues, .. }) => {
                // Abandoned one by one; those done leave the list.
                while let Some((queue, attempt)) = queues.first() {
                    let (queue, attempt) = (queue.clone(), *attempt);
                    retry()
                        .run(
                            || remote.abandon(&queue, EntryKind::Exclusive, attempt),
                            again,
                        )
                        .await?;
                    queues.remove(0);
                }
                *left = None;
                Ok(())
            }
            Some(Undo::Enqueued { .. }) => unreachable!("resolved above"),
        }
    }
}
