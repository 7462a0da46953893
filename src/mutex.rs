//! The distributed mutex and its guard.

use std::fmt;
use std::time::Duration;

use crate::acquire::{acquire_in_turn, Request, Rule, Wait};
use crate::backend::{EntryInfo, EntryKind, QueueId, QueueKind};
use crate::tenure::{holding_methods, impl_holding, Hold, Tenure};
use crate::{Result, Session};

/// A distributed mutex: a FIFO queue of sessions on the cluster, where each waiter watches
/// only its predecessor. Made by [`Session::mutex`].
///
/// Tasks of one session that lock the same mutex queue in process first; only the head of
/// that local queue holds an entry on the cluster.
///
/// ```
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use fencelock::{Fence, MemoryBackend, Session};
///
/// let backend = MemoryBackend::new();
/// let a = Session::builder(backend.clone()).start().await?;
/// let b = Session::builder(backend).start().await?;
/// let fence = Fence::new();
///
/// let guard = a.mutex("jobs/reindex")?.lock().await?;
/// fence.admit(guard.token())?; // the resource checks the token on every write
/// assert!(b.mutex("jobs/reindex")?.try_lock().await?.is_none()); // contended: None
/// guard.release().await?;
///
/// let next = b.mutex("jobs/reindex")?.lock().await?;
/// assert!(next.token() > guard.token());
/// # Ok(()) }
/// ```
pub struct Mutex {
    session: Session,
    queue: QueueId,
    /// Whether its acquisitions and holds are metrics of their own (not a semaphore's gate).
    recorded: bool,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("queue", &self.queue.path())
            .finish()
    }
}

impl Session {
    /// A mutex named `name` in this session's namespace. The name is validated here, for
    /// this backend: non-empty, at most 512 bytes, no NUL or control characters, no leading or
    /// trailing `/`, no empty, `.` or `..` segments, no last segment `read` or `write` below
    /// another (a read-write lock's entries, see [`validate_name`](crate::validate_name)), and
    /// nothing the backend forbids (ZooKeeper:
    /// characters outside its path alphabet) — [`Error::InvalidName`](crate::Error::InvalidName)
    /// otherwise.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        Ok(Mutex::new(self.clone(), self.queue(name, QueueKind::Lock)?))
    }
}

impl Mutex {
    pub(crate) fn new(session: Session, queue: QueueId) -> Self {
        Mutex {
            session,
            queue,
            recorded: true,
        }
    }

    /// A semaphore's gate: a mutex on the cluster, whose acquisitions and holds are the
    /// semaphore's (recorded by it), not a mutex's.
    pub(crate) fn gate(session: Session, queue: QueueId) -> Self {
        Mutex {
            session,
            queue,
            recorded: false,
        }
    }

    /// The queue this mutex takes entries in.
    pub(crate) fn queue_id(&self) -> &QueueId {
        &self.queue
    }

    /// The mutex's name.
    pub fn name(&self) -> &str {
        &self.queue.name
    }

    /// The session this mutex belongs to.
    pub fn session(&self) -> &Session {
        &self.session
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<Guard>> {
        let req = Request {
            queue: &self.queue,
            kind: EntryKind::Exclusive,
            rule: Rule::Exclusive,
            value: b"",
            recorded: self.recorded,
            since: None,
        };
        let tenure = acquire_in_turn(&self.session, req, false, wait).await?;
        Ok(tenure.map(Guard::new))
    }

    /// Waits in the FIFO queue until this session holds the lock.
    ///
    /// A second `lock()` by a task of the same session while it holds the lock waits for that
    /// guard to be released: it is another holder. To take the lock again as the same holder,
    /// re-enter through the guard ([`Guard::reenter`]); where a second `lock()` could happen,
    /// [`try_lock`](Self::try_lock) or [`lock_timeout`](Self::lock_timeout) bound the wait.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future at any await point leaves no entry behind (the removal
    /// is handed to the session's background task; [`Session::flush`] waits for it), and a
    /// grant that raced with the drop is released.
    pub async fn lock(&self) -> Result<Guard> {
        let guard = self.acquire(Wait::Forever).await?;
        Ok(guard.expect("a waiting acquire always grants"))
    }

    /// Takes the lock if it is free right now; `Ok(None)` if someone holds it, another session
    /// or another task of this one (contention is not an error). Leaves no entry behind when
    /// it returns `None`.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<Option<Guard>> {
        self.acquire(Wait::No).await
    }

    /// The current holder of the lock, if any: its key, token, session and (on ZooKeeper) the
    /// time its entry was created.
    pub async fn holder(&self) -> Result<Option<EntryInfo>> {
        Ok(self.inspect().await?.into_iter().next())
    }

    /// The sessions waiting for the lock, in queue order.
    pub async fn waiters(&self) -> Result<Vec<EntryInfo>> {
        Ok(self.inspect().await?.into_iter().skip(1).collect())
    }

    /// Every entry of the lock's queue, the holder first.
    pub(crate) async fn queue_entries(&self) -> Result<Vec<EntryInfo>> {
        self.inspect().await
    }

    async fn inspect(&self) -> Result<Vec<EntryInfo>> {
        let shared = self.session.shared();
        shared
            .retry_read(|| shared.remote.inspect(&self.queue))
            .await
    }

    /// Asks the current holder to let go: its guard's
    /// [`revoke_requested`](Guard::revoke_requested) resolves, and it decides what to do (a
    /// request, not a forced release). Written as Apache Curator's `Revoker` does, so Curator
    /// holders made revocable see it too. Returns the holder asked, or `None` if the lock is
    /// free. (To take the lock by force, delete the holder's entry: its `lost()` fires.)
    ///
    /// Where a mutex and an election of one name are one queue (etcd, Redis, memory: see the
    /// README's "One name, several primitives"), the holder can be that election's leader: the
    /// request then replaces the value it proclaimed, which its observers (Go's and `etcdctl
    /// elect`'s too) see. Give a mutex you revoke a name no election uses.
    pub async fn request_revoke(&self) -> Result<Option<EntryInfo>> {
        let Some(holder) = self.holder().await? else {
            return Ok(None);
        };
        let shared = self.session.shared();
        let asked = shared
            .retry_read(|| shared.remote.request_revoke(&holder.key, holder.token))
            .await?;
        Ok(asked.then_some(holder))
    }

    /// Like [`lock`](Self::lock), but gives up after `timeout` with
    /// [`Error::Timeout`](crate::Error::Timeout). When it returns the timeout error, its queue
    /// entry has already been removed (confirmed by the cluster); should the cluster refuse
    /// the removal (a permanent error, a permission withdrawn), that error is returned
    /// instead, and the entry goes with the session.
    ///
    /// A cluster that does not answer (a partition, servers that hang) ends the call half a
    /// TTL (at least a second, at most twenty) past the timeout with a temporary
    /// [`Error::Backend`](crate::Error::Backend), and [`try_lock`](Self::try_lock) as long
    /// after its call: whatever the attempt may have created is then removed by the session's
    /// background task once the cluster answers, or goes with the session. A session lost
    /// before the removal was confirmed (its local deadline passed meanwhile) ends the call
    /// with [`Error::SessionLost`](crate::Error::SessionLost), not the timeout.
    ///
    /// The timeout bounds the waiting, not the first request: `lock_timeout(Duration::ZERO)`
    /// grants a free lock, like [`try_lock`](Self::try_lock), and fails with a timeout on a
    /// held one. A timeout too large for the clock (`Duration::MAX`) waits forever.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Guard> {
        let guard = self.acquire(Wait::at_most(timeout)).await?;
        Ok(guard.expect("a waiting acquire always grants"))
    }
}

/// Proof of holding a [`Mutex`], with the fencing token of this grant.
///
/// Dropping the guard releases the lock in the background: it never blocks and never panics,
/// with or without a runtime. Prefer [`release`](Self::release) to know the release was
/// confirmed.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct Guard {
    hold: Hold,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.key())
            .field("token", &self.token())
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard {
    pub(crate) fn new(tenure: Tenure) -> Self {
        Guard {
            hold: Hold::new(tenure),
        }
    }

    /// Whether its grant had to wait for another holder.
    pub(crate) fn waited(&self) -> bool {
        self.hold.tenure().waited()
    }

    holding_methods!("lock");

    /// Takes the lock again through this guard (reentrancy): a second guard on the same entry,
    /// with the same token, at once and without a request. The lock is released when the last
    /// of the guards is released or dropped.
    ///
    /// Reentrancy goes through the guard because async code has no thread identity: a task
    /// moves between threads, and one logical operation may spread over several tasks, so
    /// "the same holder" can only be "whoever holds this proof". A plain [`Mutex::lock`] by
    /// the same session waits for the guard instead (it is another holder).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> fencelock::Result<()> {
    /// use fencelock::{MemoryBackend, Session};
    /// let session = Session::builder(MemoryBackend::new()).start().await?;
    /// let outer = session.mutex("a")?.lock().await?;
    /// let inner = outer.reenter()?;               // e.g. handed to a helper that locks "a" too
    /// assert_eq!(inner.token(), outer.token());
    /// inner.release().await?;                     // the lock is still held
    /// assert!(outer.is_held());
    /// outer.release().await?;                     // now it is released
    /// # Ok(()) }
    /// ```
    pub fn reenter(&self) -> Result<Guard> {
        Ok(Guard {
            hold: self.hold.share()?,
        })
    }

    /// Resolves when the lock is no longer held through any of its guards (the last one
    /// released or dropped, the session lost, the entry deleted): a Supervisor's term ends
    /// then, not when the first guard goes while a reentered one holds on.
    pub(crate) fn tenure_lost(
        &self,
    ) -> impl std::future::Future<Output = crate::LostReason> + Send + 'static {
        self.hold.tenure().lost()
    }
}

impl_holding!(Guard);

#[cfg(test)]
mod tests {
    use crate::{MemoryBackend, Session};

    /// Dropping a guard never blocks and never panics, with or without a runtime.
    #[test]
    fn drop_guard_outside_a_runtime() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let backend = MemoryBackend::new();
        let (session, g1, g2) = rt.block_on(async {
            let s = Session::builder(backend.clone()).start().await.unwrap();
            let g1 = s.mutex("a").unwrap().lock().await.unwrap();
            let g2 = s.mutex("b").unwrap().lock().await.unwrap();
            (s, g1, g2)
        });
        // On a plain thread with no runtime: the release is handed to the session's task.
        std::thread::spawn(move || drop(g1)).join().unwrap();
        let left = rt.block_on(async {
            session.flush().await;
            session.list_entries().await.unwrap()
        });
        assert_eq!(left, vec![g2.key().to_string()]);
        // After the runtime is gone: still no panic.
        drop(rt);
        drop(g2);
        drop(session);
    }
}
