//! The work that dropped guards and cancelled acquisitions hand to the session's background
//! task (`cleanup.rs` carries it out): what may have been created, and the local queue slot that
//! must not be given to the next local waiter before the remote entry is gone.

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::local::LocalSlot;
use crate::backend::{Enqueued, Entry, EntryKind, QueueId};
use crate::Result;

/// An enqueue request in flight, running as a task of its own: dropping the acquisition that
/// sent it cannot cut it off half way, so whoever cleans up can await its answer and knows
/// exactly what was created.
pub(crate) type EnqueueTask = JoinHandle<Result<Enqueued>>;

/// An all-or-nothing enqueue in flight (see [`EnqueueTask`]).
pub(crate) type EnqueueAllTask = JoinHandle<Result<Option<Vec<Entry>>>>;

/// Work for the session's background task. Each carries the local queue slot of its lock, so
/// that the next local waiter cannot start before the remote entry is gone.
pub(crate) enum Cleanup {
    /// Delete this entry (guarded by its identity).
    Remove {
        queue: QueueId,
        entry: Entry,
        local: Option<LocalSlot>,
    },
    /// Await the create request still in flight, then delete what it created.
    Enqueued {
        queue: QueueId,
        kind: EntryKind,
        attempt: Uuid,
        inflight: EnqueueTask,
        local: Option<LocalSlot>,
    },
    /// Await the all-or-nothing create still in flight (if any), then delete what it created.
    /// With `maybe_created`, an earlier try may have created entries that no reply reported:
    /// every attempt is abandoned, whatever the last answer says.
    EnqueuedAll {
        queues: Vec<(QueueId, Uuid)>,
        inflight: Option<EnqueueAllTask>,
        maybe_created: bool,
        locals: Vec<LocalSlot>,
    },
    /// Delete whatever this attempt may have created.
    Abandon {
        queue: QueueId,
        kind: EntryKind,
        attempt: Uuid,
        local: Option<LocalSlot>,
    },
    /// Answer once every earlier item is done.
    Flush(oneshot::Sender<()>),
}
