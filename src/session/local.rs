//! The in-process queue of a session: tasks of one session that want the same lock queue here
//! first, so that the session settles local contention without requests (and, for a mutex,
//! holds one remote entry per lock).

use std::borrow::Cow;
// foldhash, not SipHash: looked up on every acquisition, and seeded per process.
use foldhash::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, RwLock as AsyncRwLock};

use crate::backend::{QueueId, QueueKind};

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

/// The local queues of one session, one per lock queue in use.
pub(crate) struct LocalQueues {
    map: Mutex<Map>,
    /// Whether the backend makes a mutex and an election of one name one queue (see
    /// [`local_key`]).
    mutex_and_election_shared: bool,
}

/// The queues by lock, and the size at which the next insertion sweeps out the unused ones.
#[derive(Default)]
struct Map {
    queues: HashMap<QueueId, LocalQueue>,
    sweep_at: usize,
}

/// The least size at which the map is swept.
const SWEEP_FROM: usize = 64;

impl LocalQueues {
    /// No queue yet, for a backend that makes a mutex and an election of one name one queue
    /// or not.
    pub(crate) fn new(mutex_and_election_shared: bool) -> Self {
        LocalQueues {
            map: Mutex::new(Map {
                queues: HashMap::default(),
                sweep_at: SWEEP_FROM,
            }),
            mutex_and_election_shared,
        }
    }

    /// The local queue for `queue`, made by `make` on first use.
    ///
    /// A new queue may first sweep out those nobody uses: an acquisition that ends without a
    /// grant (a `try_lock` that finds the lock taken, a timeout, an error) does not [`trim`]
    /// its queue, and a session that tries many names must not keep one for each. The sweep
    /// comes when the map has doubled since the last one: amortized, a constant per insertion.
    ///
    /// [`trim`]: LocalQueues::trim
    pub(crate) fn get(&self, queue: &QueueId, make: impl FnOnce() -> LocalQueue) -> LocalQueue {
        let key = local_key(queue, self.mutex_and_election_shared);
        let mut map = self.map.lock().unwrap();
        if let Some(q) = map.queues.get(&*key) {
            return q.clone();
        }
        if map.queues.len() >= map.sweep_at {
            map.queues.retain(|_, q| !q.unused());
            map.sweep_at = SWEEP_FROM.max(2 * map.queues.len());
        }
        let q = make();
        map.queues.insert(key.into_owned(), q.clone());
        q
    }

    /// Forgets the local queue of `queue` if nobody uses it (keeps the map small).
    pub(crate) fn trim(&self, queue: &QueueId) {
        let key = local_key(queue, self.mutex_and_election_shared);
        let mut map = self.map.lock().unwrap();
        if map.queues.get(&*key).is_some_and(LocalQueue::unused) {
            map.queues.remove(&*key);
        }
    }

    /// How many local queues the map holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().queues.len()
    }
}

/// The local queue a queue's tasks line up in. A mutex and an election of the same name share
/// one where the backend makes them one queue (`mutex_and_election_share_queue`): on etcd
/// (Go's layout), in memory and on Redis both make the same entry key
/// `{namespace}/{name}/{session}`, so letting them queue apart would let the second adopt the
/// first's entry (a grant without waiting, and a release that deletes the other's entry).
/// Where they are independent (ZooKeeper), they are independent in one session too.
/// (Borrowed where it is the queue itself: looked up twice per acquisition.)
fn local_key(queue: &QueueId, mutex_and_election_shared: bool) -> Cow<'_, QueueId> {
    match queue.kind {
        QueueKind::Election if mutex_and_election_shared => Cow::Owned(QueueId::new(
            queue.namespace.clone(),
            queue.name.clone(),
            QueueKind::Lock,
        )),
        _ => Cow::Borrowed(queue),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(i: usize) -> QueueId {
        QueueId::new("ns", format!("job-{i}"), QueueKind::Lock)
    }

    /// Acquisitions that end without a grant do not trim their queues; the map stays bounded
    /// by about twice the queues in use all the same, and a queue in use is never swept.
    #[test]
    fn unused_queues_are_swept() {
        let queues = LocalQueues::new(false);
        let held = queues.get(&queue(0), LocalQueue::exclusive);
        for i in 1..10_000 {
            drop(queues.get(&queue(i), LocalQueue::exclusive));
            assert!(
                queues.len() <= 2 * SWEEP_FROM,
                "{} queues after {i}",
                queues.len()
            );
        }
        let again = queues.get(&queue(0), LocalQueue::exclusive);
        match (&held, &again) {
            (LocalQueue::Exclusive(a), LocalQueue::Exclusive(b)) => assert!(Arc::ptr_eq(a, b)),
            _ => panic!("not the queue in use"),
        }
    }
}
