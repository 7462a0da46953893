//! The in-process queue of a session: tasks of one session that want the same lock queue here
//! first, so that the session holds one remote entry per lock and settles local contention
//! without requests.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// The local queue of one session for one lock (FIFO: tokio's mutex is fair).
#[derive(Clone, Default)]
pub(crate) struct LocalQueue {
    exclusive: Arc<AsyncMutex<()>>,
}

impl LocalQueue {
    /// Whether only the session's map still refers to it.
    pub(crate) fn unused(&self) -> bool {
        Arc::strong_count(&self.exclusive) == 1
    }

    /// Waits for the local turn.
    pub(crate) async fn lock(self) -> LocalSlot {
        LocalSlot(Box::new(self.exclusive.lock_owned().await))
    }

    /// Takes the local turn if it is free now.
    pub(crate) fn try_lock(self) -> Option<LocalSlot> {
        self.exclusive
            .try_lock_owned()
            .ok()
            .map(|g| LocalSlot(Box::new(g)))
    }
}

/// A place at the head of a local queue; dropping it lets the next local waiter go.
pub(crate) struct LocalSlot(#[allow(dead_code)] Box<OwnedMutexGuard<()>>);

impl fmt::Debug for LocalSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LocalSlot")
    }
}
