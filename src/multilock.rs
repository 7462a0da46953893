//! Several mutexes taken together, deadlock-free.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::{acquire_all, local_turn, unless_silent, Wait};
use crate::{Error, FencingToken, Guard, LostReason, Mutex, Result, Session};

impl Session {
    /// The mutexes named `names` taken together: a [`MultiLock`]. Duplicates are ignored; the
    /// names are validated as [`mutex`](Self::mutex) does, and at least one is required.
    ///
    /// A set must fit in one atomic request of the backend (for
    /// [`try_lock`](MultiLock::try_lock)): at most
    /// [`Backend::max_multi_lock`](crate::backend::Backend::max_multi_lock) distinct names (64
    /// on etcd and in memory, 128 on ZooKeeper, 256 on Redis); a larger set is refused here with
    /// [`Error::InvalidConfig`].
    pub fn multi_lock<I, S>(&self, names: I) -> Result<MultiLock>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut names: Vec<String> = names.into_iter().map(|n| n.as_ref().to_string()).collect();
        // The canonical order: every multi-lock takes its locks in it, so two cannot deadlock.
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Err(Error::invalid_config(
                "",
                "a multi-lock needs at least one name",
            ));
        }
        // The names first: a bad name is the error to report, however many there are.
        let mutexes = names
            .iter()
            .map(|n| self.mutex(n))
            .collect::<Result<Vec<_>>>()?;
        let max = self.shared().backend.max_multi_lock();
        if names.len() > max {
            return Err(Error::invalid_config(
                format!("{} names", names.len()),
                format!(
                    "more than the {} backend takes in one atomic request: at most {max} locks in a multi-lock",
                    self.backend_name()
                ),
            ));
        }
        Ok(MultiLock {
            session: self.clone(),
            names,
            mutexes,
        })
    }
}

/// Several distributed mutexes taken together. Made by [`Session::multi_lock`].
///
/// [`lock`](Self::lock) takes them one by one in a canonical order (sorted by name), which every
/// fencelock multi-lock follows, so two multi-locks over overlapping sets never deadlock (a
/// peer's that takes its locks in another order can: Curator's `InterProcessMultiLock` takes
/// them in the order it is given, so give it its paths sorted); on an error it releases what it
/// took. [`try_lock`](Self::try_lock) takes all of them in **one atomic
/// request** (an etcd transaction, a ZooKeeper `multi`), or none.
///
/// ```
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use fencelock::{MemoryBackend, Session};
///
/// let backend = MemoryBackend::new();
/// let a = Session::builder(backend.clone()).start().await?;
/// let b = Session::builder(backend).start().await?;
/// let transfer = a.multi_lock(["accounts/42", "accounts/7"])?.lock().await?;
/// let other = b.multi_lock(["accounts/7", "accounts/9"])?;
/// assert!(other.try_lock().await?.is_none());        // accounts/7 is taken: nothing is taken
/// assert!(b.mutex("accounts/9")?.try_lock().await?.is_some());
/// transfer.release().await?;
/// # Ok(()) }
/// ```
pub struct MultiLock {
    session: Session,
    names: Vec<String>,
    mutexes: Vec<Mutex>,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("names", &self.names)
            .finish()
    }
}

impl MultiLock {
    /// The names, in the canonical order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Takes every lock, one after another in the canonical order, waiting for each.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what was taken and leaves no entry behind.
    pub async fn lock(&self) -> Result<MultiGuard> {
        self.lock_until(None).await
    }

    /// Like [`lock`](Self::lock), but gives up after `timeout` for the whole set with
    /// [`Error::Timeout`], having released what it took (confirmed by the cluster) and left no
    /// entry.
    ///
    /// The deadline is checked before each lock: once it has passed, no further lock is tried,
    /// so the error comes at most about two round trips after the deadline (the lock in flight,
    /// then the releases, sent together), whatever the size of the set, while the cluster
    /// answers. A cluster that does not answer ends it half a TTL (at least a second, at most
    /// twenty) past the deadline, with a temporary error; the removals it did not confirm are
    /// then left to the session's background task. So `lock_timeout(Duration::ZERO)` takes a
    /// set of one free lock, and times out on a larger set: to take a set only if all of it
    /// is free now, use [`try_lock`](Self::try_lock).
    /// A timeout too large for the clock waits forever.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MultiGuard> {
        let deadline = crate::acquire::deadline_after(timeout);
        self.lock_until(deadline.map(|d| (d, timeout))).await
    }

    async fn lock_until(&self, deadline: Option<(Instant, Duration)>) -> Result<MultiGuard> {
        let mut guards = Vec::with_capacity(self.mutexes.len());
        for (name, m) in self.names.iter().zip(&self.mutexes) {
            let guard = match deadline {
                None => m.lock().await,
                Some((d, after)) => {
                    let left = d.saturating_duration_since(Instant::now());
                    // Past the deadline, even a free lock costs a round trip: with many locks
                    // left those would add up far past it.
                    if left.is_zero() && !guards.is_empty() {
                        Err(Error::Timeout {
                            op: "multi-lock",
                            after,
                        })
                    } else {
                        m.lock_timeout(left).await.map_err(|e| match e {
                            Error::Timeout { .. } => Error::Timeout {
                                op: "multi-lock",
                                after,
                            },
                            e => e,
                        })
                    }
                }
            };
            match guard {
                Ok(g) => guards.push((name.clone(), g)),
                Err(e) => {
                    // An entry the cluster refuses to remove stays: that is the answer then,
                    // since "not acquired" promises none is left. So is a cluster silent past
                    // the wait (the guards, dropped, leave their removal to the session).
                    let wait = match deadline {
                        Some((deadline, after)) => Wait::Until { deadline, after },
                        None => Wait::Forever,
                    };
                    unless_silent(self.session.shared(), wait, release_all(&guards)).await?;
                    return Err(e);
                }
            }
        }
        Ok(MultiGuard { guards })
    }

    /// Takes every lock if all are free right now, in one atomic request; `Ok(None)` if any is
    /// taken, and then nothing was taken or left behind. (On ZooKeeper, which cannot compare a
    /// node's children inside a `multi`, a refused set is created and deleted again before
    /// this returns: others may see its entries for that round trip.)
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<Option<MultiGuard>> {
        let shared = self.session.shared();
        let mut locals = Vec::with_capacity(self.mutexes.len());
        for m in &self.mutexes {
            match local_turn(shared, m.queue_id(), false, Wait::No).await? {
                Some((slot, _)) => locals.push(slot),
                None => return Ok(None), // held by another task of this session
            }
        }
        let queues: Vec<_> = self.mutexes.iter().map(|m| m.queue_id().clone()).collect();
        let all = acquire_all(&self.session, &queues, locals);
        let Some(tenures) = unless_silent(shared, Wait::No, all).await? else {
            return Ok(None);
        };
        let guards = self
            .names
            .iter()
            .cloned()
            .zip(tenures.into_iter().map(Guard::new))
            .collect();
        Ok(Some(MultiGuard { guards }))
    }
}

/// Releases every guard (an error path), all at once: one round trip for the set rather than
/// one per lock, so that a timeout returns soon after its deadline. Returns the first
/// permanent error (a removal the cluster refuses: an entry stays); a guard already lost has
/// no entry left, and a temporary failure is finished by the session's background task.
async fn release_all(guards: &[(String, Guard)]) -> Result<()> {
    let results = futures_util::future::join_all(guards.iter().map(|(_, g)| g.release())).await;
    match results
        .into_iter()
        .filter_map(std::result::Result::err)
        .find(Error::leaves_entry)
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Proof of holding every lock of a [`MultiLock`], with one fencing token per lock.
#[must_use = "the locks are released as soon as the guard is dropped"]
pub struct MultiGuard {
    guards: Vec<(String, Guard)>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.tokens()).finish()
    }
}

impl MultiGuard {
    /// Each lock's name and token, in the canonical order.
    pub fn tokens(&self) -> Vec<(&str, FencingToken)> {
        self.guards
            .iter()
            .map(|(n, g)| (n.as_str(), g.token()))
            .collect()
    }

    /// The token of the lock `name`, if it is one of the set.
    pub fn token(&self, name: &str) -> Option<FencingToken> {
        self.guard(name).map(Guard::token)
    }

    /// The guard of the lock `name`, if it is one of the set.
    pub fn guard(&self, name: &str) -> Option<&Guard> {
        self.guards.iter().find(|(n, _)| n == name).map(|(_, g)| g)
    }

    /// Whether every lock is still held as far as this process can tell.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(|(_, g)| g.is_held())
    }

    /// Resolves when any of the locks is lost, with its name and the reason.
    pub fn lost(&self) -> impl Future<Output = (String, LostReason)> + Send + 'static {
        let each: Vec<_> = self
            .guards
            .iter()
            .map(|(n, g)| {
                let (name, lost) = (n.clone(), g.lost());
                Box::pin(async move { (name, lost.await) })
            })
            .collect();
        async move { futures_util::future::select_all(each).await.0 }
    }

    /// Releases every lock (the last taken first) and waits for the cluster to confirm; the
    /// first error, if any, after trying them all.
    ///
    /// # Cancel safety
    ///
    /// As [`Guard::release`] for each lock: dropped midway, the locks already reached count as
    /// released (the one in progress too, whose removal, if unfinished, the background task
    /// completes when this guard is dropped), the others are still held; a second call
    /// releases those and fails with `NotHeld(Released)` for the first ones. Drop the guard
    /// to have every unfinished removal completed.
    pub async fn release(&self) -> Result<()> {
        let mut first = Ok(());
        for (_, g) in self.guards.iter().rev() {
            if let Err(e) = g.release().await {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// The guards, each with its lock's name, in the canonical order.
    pub fn into_guards(self) -> Vec<(String, Guard)> {
        self.guards
    }
}
