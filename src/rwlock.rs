//! The distributed read-write lock and its guards.

use std::fmt;
use std::time::Duration;

use crate::acquire::{acquire_in_turn, Request, Rule, Wait};
use crate::backend::{EntryInfo, EntryKind, QueueId, QueueKind};
use crate::tenure::{holding_methods, impl_holding, Hold};
use crate::{Result, Session};

impl Session {
    /// A read-write lock named `name` in this session's namespace (the name rules of
    /// [`mutex`](Self::mutex)).
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        Ok(RwLock {
            session: self.clone(),
            queue: self.queue(name, QueueKind::ReadWrite)?,
        })
    }
}

/// A distributed read-write lock: many readers or one writer, FIFO fair. Made by
/// [`Session::rwlock`].
///
/// Readers and writers queue in one order. A reader waits only for the nearest writer queued
/// before it (readers do not wait for each other, nor for writers that came after them); a
/// writer waits for the entry just before it. So a queued writer holds back the readers that
/// came after it, and writers are never starved. A writer's token is larger than the token of
/// every reader and writer granted before it, so a [`Fence`](crate::Fence) kept by the resource
/// refuses a stale writer; a reader's token is larger than that of every writer granted before
/// it.
///
/// Layouts: on ZooKeeper, Apache Curator's `InterProcessReadWriteLock` (`_c_{uuid}-__READ__{seq}`
/// and `_c_{uuid}-__WRIT__{seq}` under the lock's node); on etcd, etcd's Go `contrib/recipes`
/// `RWMutex` (`{namespace}/{name}/read/…` and `…/write/…` keys under the session's lease).
///
/// ```
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use fencelock::{MemoryBackend, Session};
///
/// let backend = MemoryBackend::new();
/// let a = Session::builder(backend.clone()).start().await?;
/// let b = Session::builder(backend).start().await?;
/// let r1 = a.rwlock("catalog")?.read().await?;
/// let r2 = b.rwlock("catalog")?.read().await?;          // readers share
/// assert!(b.rwlock("catalog")?.try_write().await?.is_none());
/// r1.release().await?;
/// r2.release().await?;
/// let w = b.rwlock("catalog")?.write().await?;
/// assert!(w.token() > r2.token());                      // a writer's token exceeds them all
/// # Ok(()) }
/// ```
pub struct RwLock {
    session: Session,
    queue: QueueId,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("queue", &self.queue.path())
            .finish()
    }
}

impl RwLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.queue.name
    }

    async fn acquire(&self, writer: bool, wait: Wait) -> Result<Option<Hold>> {
        let req = Request {
            queue: &self.queue,
            kind: if writer {
                EntryKind::Exclusive
            } else {
                EntryKind::Shared
            },
            rule: if writer {
                Rule::Exclusive
            } else {
                Rule::Shared
            },
            value: b"",
            recorded: true,
            since: None,
        };
        Ok(acquire_in_turn(&self.session, req, !writer, wait)
            .await?
            .map(Hold::new))
    }

    /// Waits until this session may read: no writer queued before it holds or waits.
    ///
    /// A second `read()` while this session reads is another reader: it queues behind any
    /// writer that came in between (a writer of this session or another), which waits for the
    /// first read to end. A task that holds a read and reads again can so wait for ever: read
    /// again through the guard ([`ReadGuard::reenter`]). There is no upgrade: a `write()` while
    /// the same task reads waits for that read, for ever.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe like [`Mutex::lock`](crate::Mutex::lock): dropping the future leaves no
    /// entry behind.
    pub async fn read(&self) -> Result<ReadGuard> {
        let hold = self.acquire(false, Wait::Forever).await?;
        Ok(ReadGuard {
            hold: hold.expect("a waiting acquire always grants"),
        })
    }

    /// Reads if that is possible right now; `Ok(None)` if a writer holds or waits.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        Ok(self
            .acquire(false, Wait::No)
            .await?
            .map(|hold| ReadGuard { hold }))
    }

    /// Like [`read`](Self::read), but gives up after `timeout` with
    /// [`Error::Timeout`](crate::Error::Timeout), leaving no entry.
    /// A cluster that does not answer ends it as [`Mutex::lock_timeout`](crate::Mutex::lock_timeout)
    /// says.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn read_timeout(&self, timeout: Duration) -> Result<ReadGuard> {
        let hold = self.acquire(false, Wait::at_most(timeout)).await?;
        Ok(ReadGuard {
            hold: hold.expect("a waiting acquire always grants"),
        })
    }

    /// Waits until this session may write: alone, after every entry queued before it, this
    /// session's own reads included (a task that reads and then writes waits for ever; there is
    /// no upgrade). Write again as the same holder through the guard ([`WriteGuard::reenter`]).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn write(&self) -> Result<WriteGuard> {
        let hold = self.acquire(true, Wait::Forever).await?;
        Ok(WriteGuard {
            hold: hold.expect("a waiting acquire always grants"),
        })
    }

    /// Writes if that is possible right now; `Ok(None)` if anyone holds or waits.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        Ok(self
            .acquire(true, Wait::No)
            .await?
            .map(|hold| WriteGuard { hold }))
    }

    /// Like [`write`](Self::write), but gives up after `timeout` with
    /// [`Error::Timeout`](crate::Error::Timeout), leaving no entry.
    /// A cluster that does not answer ends it as [`Mutex::lock_timeout`](crate::Mutex::lock_timeout)
    /// says.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn write_timeout(&self, timeout: Duration) -> Result<WriteGuard> {
        let hold = self.acquire(true, Wait::at_most(timeout)).await?;
        Ok(WriteGuard {
            hold: hold.expect("a waiting acquire always grants"),
        })
    }

    /// Who holds the lock now (the readers ahead of the first writer, or that writer) and who
    /// waits, in queue order.
    pub async fn inspect(&self) -> Result<(Vec<EntryInfo>, Vec<EntryInfo>)> {
        let shared = self.session.shared();
        let mut all = shared
            .retry_read(|| shared.remote.inspect(&self.queue))
            .await?;
        let holders = match all.first().map(|e| e.kind) {
            None => 0,
            Some(EntryKind::Exclusive) => 1,
            Some(_) => all
                .iter()
                .position(|e| e.kind == EntryKind::Exclusive)
                .unwrap_or(all.len()),
        };
        let waiters = all.split_off(holders);
        Ok((all, waiters))
    }
}

/// Proof of reading under an [`RwLock`]: no writer holds it meanwhile.
#[must_use = "the read lock is released as soon as the guard is dropped"]
pub struct ReadGuard {
    hold: Hold,
}

/// Proof of writing under an [`RwLock`]: nobody else holds it meanwhile.
#[must_use = "the write lock is released as soon as the guard is dropped"]
pub struct WriteGuard {
    hold: Hold,
}

impl ReadGuard {
    holding_methods!("read lock");

    /// Reads again through this guard (reentrancy, see [`Guard::reenter`](crate::Guard::reenter)):
    /// a second guard on the same entry, with the same token; the read lock is released when
    /// the last of them is.
    pub fn reenter(&self) -> Result<ReadGuard> {
        Ok(ReadGuard {
            hold: self.hold.share()?,
        })
    }
}

impl WriteGuard {
    holding_methods!("write lock");

    /// Writes again through this guard (reentrancy, see [`Guard::reenter`](crate::Guard::reenter)):
    /// a second guard on the same entry, with the same token; the write lock is released when
    /// the last of them is.
    pub fn reenter(&self) -> Result<WriteGuard> {
        Ok(WriteGuard {
            hold: self.hold.share()?,
        })
    }
}

impl_holding!(ReadGuard);
impl_holding!(WriteGuard);

impl fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadGuard")
            .field("key", &self.key())
            .field("token", &self.token())
            .field("held", &self.is_held())
            .finish()
    }
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard")
            .field("key", &self.key())
            .field("token", &self.token())
            .field("held", &self.is_held())
            .finish()
    }
}
