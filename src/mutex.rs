//! The distributed mutex and its guard.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::QueueId;
use crate::queue::{acquire, Held, Wait};
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

impl Mutex {
    pub(crate) fn new(session: Session, queue: QueueId) -> Self {
        Mutex { session, queue }
    }

    /// The mutex's name.
    pub fn name(&self) -> &str {
        &self.queue.name
    }

    /// The session this mutex belongs to.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Waits in the FIFO queue until this session holds the lock.
    ///
    /// Cancel-safe: dropping the future at any point leaves no entry behind (the removal is
    /// handed to the session's background task; [`Session::flush`] waits for it), and a grant
    /// that raced with the drop is released.
    pub async fn lock(&self) -> Result<Guard> {
        let held = acquire(&self.session, &self.queue, b"", Wait::Forever).await?;
        Ok(Guard {
            held: held.expect("waiting acquire always grants"),
        })
    }

    /// Takes the lock if it is free right now; `Ok(None)` if someone holds it (contention is
    /// not an error). Leaves no entry behind when it returns `None`.
    pub async fn try_lock(&self) -> Result<Option<Guard>> {
        let held = acquire(&self.session, &self.queue, b"", Wait::No).await?;
        Ok(held.map(|held| Guard { held }))
    }

    /// Like [`lock`](Self::lock), but gives up after `timeout` with
    /// [`Error::Timeout`](crate::Error::Timeout). When it returns the timeout error, its queue
    /// entry has already been removed (confirmed by the cluster).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Guard> {
        let wait = Wait::Until(Instant::now() + timeout, timeout);
        let held = acquire(&self.session, &self.queue, b"", wait).await?;
        Ok(Guard {
            held: held.expect("waiting acquire always grants"),
        })
    }
}

/// Proof of holding a [`Mutex`], with the fencing token of this grant.
///
/// Dropping the guard releases the lock in the background: it never blocks and never panics,
/// with or without a runtime. Prefer [`release`](Self::release) to know the release was
/// confirmed.
pub struct Guard {
    held: Held,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.held.entry.key)
            .field("token", &self.held.token())
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard {
    /// The fencing token of this grant: strictly larger than any earlier holder's. Send it
    /// with every write to the protected resource.
    pub fn token(&self) -> FencingToken {
        self.held.token()
    }

    /// The key or node path of our entry on the cluster.
    pub fn key(&self) -> &str {
        &self.held.entry.key
    }

    /// Resolves when the lock is lost: the cluster expired the session, our entry was deleted
    /// by someone else, the local deadline passed without a confirmed heartbeat, the session
    /// was closed, or the guard was released. (The watch for deletion by someone else starts
    /// 50 ms after the grant, so that short critical sections cost no extra request; session
    /// loss is watched from the start.)
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.held.lost()
    }

    /// Whether the lock is still held as far as this process can tell (false past the local
    /// deadline even while the cluster is unreachable).
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// Releases the lock and waits for the cluster to confirm. A second call fails with
    /// [`Error::NotHeld`](crate::Error::NotHeld); a release after the lock was lost reports
    /// why. Never deletes another holder's entry.
    pub async fn release(&self) -> Result<()> {
        self.held.release().await
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
