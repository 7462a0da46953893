//! The in-process queue of a session: tasks of one session that want the same lock queue here
//! first, so that the session settles local contention without requests (and, for a mutex,
//! holds one remote entry per lock).

use std::fmt;
use std::sync::Arc;

use tokio::sync::{Mutex as AsyncMutex, RwLock as AsyncRwLock};

/// The local queue of one session for one lock: FIFO (tokio's mutex and read-write lock are
/// fair: a queued writer holds back readers that came after it, as on the cluster).
#[derive(Clone)]
pub(crate) enum LocalQueue {
    /// A mutex or an election: one task at a time.
    Exclusive(Arc<AsyncMutex<()>>),
    /// A read-write lock: local readers together, a local writer alone.
    ReadWrite(Arc<AsyncRwLock<()>>),
}

impl LocalQueue {
    /// A queue for one task at a time.
    pub(crate) fn exclusive() -> Self {
        LocalQueue::Exclusive(Arc::default())
    }

    /// A queue for readers and writers.
    pub(crate) fn read_write() -> Self {
        LocalQueue::ReadWrite(Arc::default())
    }

    /// Whether only the session's map still refers to it.
    pub(crate) fn unused(&self) -> bool {
        match self {
            LocalQueue::Exclusive(q) => Arc::strong_count(q) == 1,
            LocalQueue::ReadWrite(q) => Arc::strong_count(q) == 1,
        }
    }

    /// Waits for the local turn; `shared` asks for a reader's turn.
    pub(crate) async fn lock(self, shared: bool) -> LocalSlot {
        match self {
            LocalQueue::Exclusive(q) => LocalSlot(Box::new(q.lock_owned().await)),
            LocalQueue::ReadWrite(q) if shared => LocalSlot(Box::new(q.read_owned().await)),
            LocalQueue::ReadWrite(q) => LocalSlot(Box::new(q.write_owned().await)),
        }
    }

    /// Takes the local turn if it is free now.
    pub(crate) fn try_lock(self, shared: bool) -> Option<LocalSlot> {
        match self {
            LocalQueue::Exclusive(q) => q.try_lock_owned().ok().map(|g| LocalSlot(Box::new(g))),
            LocalQueue::ReadWrite(q) if shared => {
                q.try_read_owned().ok().map(|g| LocalSlot(Box::new(g)))
            }
            LocalQueue::ReadWrite(q) => q.try_write_owned().ok().map(|g| LocalSlot(Box::new(g))),
        }
    }
}

/// A place at the head of a local queue; dropping it lets the next local waiter go.
pub(crate) struct LocalSlot(#[allow(dead_code)] Box<dyn Send + Sync>);

impl fmt::Debug for LocalSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LocalSlot")
    }
}
