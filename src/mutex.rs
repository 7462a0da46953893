//! The distributed mutex and its guard.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::acquire::{acquire, local_turn, Request, Rule, Wait};
use crate::backend::{EntryKind, QueueId, QueueKind};
use crate::tenure::Tenure;
use crate::{FencingToken, LostReason, Result, Session};

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
    /// trailing `/`, no empty, `.` or `..` segments, and nothing the backend forbids (ZooKeeper:
    /// characters outside its path alphabet) — [`Error::InvalidName`](crate::Error::InvalidName)
    /// otherwise.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        Ok(Mutex {
            session: self.clone(),
            queue: self.queue(name, QueueKind::Lock)?,
        })
    }
}

impl Mutex {
    /// The mutex's name.
    pub fn name(&self) -> &str {
        &self.queue.name
    }

    /// The session this mutex belongs to.
    pub fn session(&self) -> &Session {
        &self.session
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<Guard>> {
        let shared = self.session.shared();
        let Some(local) = local_turn(shared, &self.queue, wait).await? else {
            return Ok(None);
        };
        let req = Request {
            queue: &self.queue,
            kind: EntryKind::Exclusive,
            rule: Rule::Exclusive,
            value: b"",
        };
        let tenure = acquire(&self.session, req, local, wait).await?;
        Ok(tenure.map(|tenure| Guard { tenure }))
    }

    /// Waits in the FIFO queue until this session holds the lock.
    ///
    /// A second `lock()` by a task of the same session while it holds the lock waits for that
    /// guard to be released (the lock is not reentrant: a guard is the proof of holding it, so
    /// hand the guard down instead of locking again). Use
    /// [`try_lock`](Self::try_lock) or [`lock_timeout`](Self::lock_timeout) where that could
    /// happen.
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

    /// Like [`lock`](Self::lock), but gives up after `timeout` with
    /// [`Error::Timeout`](crate::Error::Timeout). When it returns the timeout error, its queue
    /// entry has already been removed (confirmed by the cluster).
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
    tenure: Tenure,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.tenure.entry.key)
            .field("token", &self.tenure.token())
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard {
    /// The fencing token of this grant: strictly larger than any earlier holder's. Send it
    /// with every write to the protected resource.
    pub fn token(&self) -> FencingToken {
        self.tenure.token()
    }

    /// The key or node path of our entry on the cluster.
    pub fn key(&self) -> &str {
        &self.tenure.entry.key
    }

    /// The session this guard belongs to.
    pub fn session(&self) -> &Session {
        &self.tenure.session
    }

    /// How long this guard has been held.
    pub fn held_for(&self) -> Duration {
        self.tenure.held_for()
    }

    /// Resolves when the lock is lost: the session ended (the cluster expired it, the local
    /// deadline passed without a confirmed heartbeat, or it was closed), our entry was deleted
    /// by someone else, or the guard was released.
    ///
    /// Deletion by someone else is watched on the cluster only while a `lost()` future is
    /// polled (a held lock costs no server watch otherwise); the session's own loss is always
    /// known.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.tenure.lost()
    }

    /// Whether the lock is still held as far as this process can tell (false past the local
    /// deadline even while the cluster is unreachable).
    pub fn is_held(&self) -> bool {
        self.tenure.is_held()
    }

    /// Releases the lock and waits for the cluster to confirm. Never deletes another holder's
    /// entry. Fails with [`Error::NotHeld`](crate::Error::NotHeld) and the reason if the guard
    /// was already released or lost (its entry deleted, its session ended).
    pub async fn release(&self) -> Result<()> {
        self.tenure.release().await
    }
}

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
