//! The acquire path shared by [`Mutex`](crate::Mutex) and [`Election`](crate::Election):
//! local FIFO queue first, then one remote entry that waits on its predecessor only.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{watch, OwnedMutexGuard};
use tokio::task::JoinHandle;
use tokio::time::{timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info_span, Instrument};
use uuid::Uuid;

use crate::backend::{Entry, QueueId};
use crate::session::{Cleanup, Shared};
use crate::{Error, FencingToken, LostReason, Result, Session};

/// How long an acquisition may wait.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    /// Until granted (or the session is lost).
    Forever,
    /// Not at all: give up if the lock is held.
    No,
    /// Until this instant, then fail with a timeout and leave no entry.
    Until(Instant, Duration),
}

/// Runs `op` until it succeeds, retrying temporary errors with backoff, and gives up with
/// [`Error::SessionLost`] as soon as the session is lost.
pub(crate) async fn with_retry<T, F, Fut>(shared: &Shared, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut backoff = Duration::from_millis(20);
    loop {
        shared.check_alive()?;
        let lost = shared.lost();
        let res = tokio::select! {
            r = op() => r,
            r = lost => return Err(Error::SessionLost(r)),
        };
        match res {
            Err(e) if e.is_temporary() => {
                debug!(error = %e, "temporary error, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// What an enqueue task answers.
pub(crate) type EnqueueTask = JoinHandle<Result<(Entry, bool)>>;

/// An acquisition in progress. If it is dropped before it is turned into a [`Held`] (a
/// cancelled future, an error, a timeout), it hands the removal of whatever it may have
/// created to the session's background task, together with the local queue slot, so that the
/// next local waiter cannot start before the remote entry is gone.
struct Pending {
    shared: Arc<Shared>,
    queue: QueueId,
    attempt: Uuid,
    /// The create request in flight. It runs as a task of its own, so that dropping the
    /// acquisition cannot cut it off half way: whoever cleans up awaits its answer and knows
    /// exactly what was created.
    inflight: Option<EnqueueTask>,
    /// An earlier create attempt failed: it may still have created an entry.
    maybe_created: bool,
    entry: Option<Entry>,
    local: Option<OwnedMutexGuard<()>>,
}

impl Pending {
    fn take_cleanup(&mut self) -> Option<Cleanup> {
        let local = self.local.take();
        let queue = self.queue.clone();
        if let Some(entry) = self.entry.take() {
            Some(Cleanup::Remove {
                queue,
                entry,
                local,
            })
        } else if let Some(inflight) = self.inflight.take() {
            Some(Cleanup::Enqueued {
                queue,
                attempt: self.attempt,
                inflight,
                local,
            })
        } else if std::mem::take(&mut self.maybe_created) {
            Some(Cleanup::Abandon {
                queue,
                attempt: self.attempt,
                local,
            })
        } else {
            None
        }
    }

    /// Removes what this attempt created *now* and confirms it (used by `try_lock` and
    /// `lock_timeout`, whose callers expect no entry to be left when they return). Falls back
    /// to the background task if that fails or is cancelled.
    async fn cleanup_now(mut self) {
        if let Some(inflight) = self.inflight.as_mut() {
            let answer = inflight.await;
            self.inflight = None;
            match answer {
                Ok(Ok((entry, _))) => self.entry = Some(entry),
                _ => self.maybe_created = true,
            }
        }
        let remote = self.shared.remote.clone();
        let res = if let Some(entry) = &self.entry {
            with_retry(&self.shared, || remote.remove(entry))
                .await
                .map(drop)
        } else if self.maybe_created {
            with_retry(&self.shared, || remote.abandon(&self.queue, self.attempt)).await
        } else {
            Ok(())
        };
        if res.is_ok() || self.shared.lost_reason().is_some() {
            self.entry = None;
            self.maybe_created = false;
        }
        // Drop hands off anything left.
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(work) = self.take_cleanup() {
            self.shared.hand_off(work);
        }
    }
}

/// Acquires a place at the head of `queue` for `session`, creating the remote entry with
/// `value`. Returns `None` only for [`Wait::No`] when the queue is taken.
pub(crate) async fn acquire(
    session: &Session,
    queue: &QueueId,
    value: &[u8],
    wait: Wait,
) -> Result<Option<Held>> {
    let shared = session.shared().clone();
    shared.check_alive()?;
    let span =
        info_span!(parent: &shared.span, "acquire", queue = %queue, token = tracing::field::Empty);
    let deadline = match wait {
        Wait::Until(d, _) => Some(d),
        _ => None,
    };
    let timed_out = |after| Error::Timeout {
        op: "acquire",
        after,
    };
    async {
        // 1. The local queue: one remote entry per session per lock.
        let local_q = shared.local_queue(queue);
        let local = match wait {
            Wait::No => match local_q.try_lock_owned() {
                Ok(g) => g,
                Err(_) => return Ok(None),
            },
            Wait::Forever => {
                let lost = shared.lost();
                tokio::select! {
                    g = local_q.lock_owned() => g,
                    r = lost => return Err(Error::SessionLost(r)),
                }
            }
            Wait::Until(d, after) => {
                let lost = shared.lost();
                tokio::select! {
                    g = timeout_at(d, local_q.lock_owned()) => g.map_err(|_| timed_out(after))?,
                    r = lost => return Err(Error::SessionLost(r)),
                }
            }
        };
        let mut pending = Pending {
            shared: shared.clone(),
            queue: queue.clone(),
            attempt: Uuid::new_v4(),
            inflight: None,
            maybe_created: false,
            entry: None,
            local: Some(local),
        };
        // 2. The remote entry, then the wait on the predecessor.
        let res = match deadline {
            Some(d) => timeout_at(d, remote_turn(&shared, queue, value, &mut pending, wait))
                .await
                .unwrap_or_else(|_| Err(timed_out(d.elapsed()))),
            None => remote_turn(&shared, queue, value, &mut pending, wait).await,
        };
        match res {
            Ok(true) => {
                // Granted: never report a grant past the local deadline.
                shared.check_alive()?;
                let entry = pending.entry.take().expect("granted entry");
                let local = pending.local.take();
                // An earlier failed create attempt is settled: the retry found or created our
                // one entry (the key is ours alone), so there is nothing left to abandon.
                pending.maybe_created = false;
                tracing::Span::current().record("token", entry.token.get());
                debug!(key = %entry.key, "granted");
                Ok(Some(Held::new(
                    session.clone(),
                    queue.clone(),
                    entry,
                    local,
                )))
            }
            Ok(false) => {
                pending.cleanup_now().await;
                Ok(None)
            }
            Err(e @ Error::Timeout { .. }) => {
                pending.cleanup_now().await;
                match wait {
                    Wait::Until(_, after) => Err(Error::Timeout {
                        op: "acquire",
                        after,
                    }),
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
    .instrument(span)
    .await
}

/// Creates the remote entry and waits until it heads the queue. Returns `Ok(false)` only for
/// [`Wait::No`] when the entry is not the head.
async fn remote_turn(
    shared: &Shared,
    queue: &QueueId,
    value: &[u8],
    pending: &mut Pending,
    wait: Wait,
) -> Result<bool> {
    let remote = shared.remote.clone();
    let mut backoff = Duration::from_millis(20);
    let (entry, head) = loop {
        shared.check_alive()?;
        let task = tokio::spawn({
            let (remote, queue, attempt) = (remote.clone(), queue.clone(), pending.attempt);
            let value = value.to_vec();
            async move { remote.enqueue(&queue, attempt, &value).await }
        });
        let inflight = pending.inflight.insert(task);
        let lost = shared.lost();
        let answer = tokio::select! {
            r = inflight => r,
            r = lost => return Err(Error::SessionLost(r)),
        };
        pending.inflight = None;
        match answer {
            Ok(Ok(v)) => break v,
            Ok(Err(e)) => {
                // Refused before anything was sent: nothing can have been created.
                pending.maybe_created =
                    !matches!(e, Error::InvalidName { .. } | Error::InvalidConfig(_));
                if !e.is_temporary() {
                    return Err(e);
                }
                debug!(error = %e, "enqueue failed, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(join) => {
                pending.maybe_created = true;
                return Err(Error::backend(
                    shared.backend_name,
                    "enqueue",
                    false,
                    join.to_string(),
                ));
            }
        }
    };
    pending.entry = Some(entry.clone());
    if head {
        return Ok(true);
    }
    if matches!(wait, Wait::No) {
        return Ok(false);
    }
    loop {
        let pred = with_retry(shared, || remote.predecessor(queue, &entry)).await?;
        let Some(pred) = pred else { return Ok(true) };
        let span = info_span!("wait", predecessor = %pred.key, token = %entry.token);
        with_retry(shared, || remote.wait_gone(&pred))
            .instrument(span)
            .await?;
    }
}

/// How long after a grant the watch on our own entry (deletion by someone else) starts.
pub(crate) const OWN_ENTRY_WATCH_DELAY: Duration = Duration::from_millis(50);

/// A granted entry: the common part of a [`Guard`](crate::Guard) and a
/// [`Leadership`](crate::Leadership).
pub(crate) struct Held {
    pub(crate) session: Session,
    pub(crate) queue: QueueId,
    pub(crate) entry: Entry,
    local: StdMutex<Option<OwnedMutexGuard<()>>>,
    released: AtomicBool,
    lost: Arc<watch::Sender<Option<LostReason>>>,
    watcher: CancellationToken,
}

impl Held {
    fn new(
        session: Session,
        queue: QueueId,
        entry: Entry,
        local: Option<OwnedMutexGuard<()>>,
    ) -> Self {
        let (tx, _) = watch::channel(None);
        let lost = Arc::new(tx);
        let watcher = CancellationToken::new();
        // One task per held entry: fires `lost` on session loss or deletion of the entry.
        let shared = session.shared().clone();
        let remote = shared.remote.clone();
        let session_lost = shared.lost();
        let weak = Arc::downgrade(&shared);
        drop(shared);
        let (tx, stop, watched) = (lost.clone(), watcher.clone(), entry.clone());
        tokio::spawn(async move {
            let gone = async {
                // Short tenures cost no extra request: the watch on our own entry starts a
                // moment after the grant (deletion by someone else is rare, and the session's
                // own loss is watched from the start).
                tokio::time::sleep(OWN_ENTRY_WATCH_DELAY).await;
                let mut backoff = Duration::from_millis(50);
                while let Err(e) = remote.wait_gone(&watched).await {
                    debug!(error = %e, "watching our entry failed, retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            };
            let reason = tokio::select! {
                _ = stop.cancelled() => return,
                r = session_lost => r,
                // A session that is closing or expiring deletes its entries too: report the
                // session's reason when it has one.
                _ = gone => weak
                    .upgrade()
                    .and_then(|s| s.lost_reason())
                    .unwrap_or(LostReason::EntryDeleted),
            };
            tx.send_if_modified(|v| {
                v.is_none() && {
                    *v = Some(reason);
                    true
                }
            });
        });
        Held {
            session,
            queue,
            entry,
            local: StdMutex::new(local),
            released: AtomicBool::new(false),
            lost,
            watcher,
        }
    }

    pub(crate) fn token(&self) -> FencingToken {
        self.entry.token
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        (*self.lost.borrow()).or_else(|| self.session.shared().lost_reason())
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lost_reason().is_none()
    }

    pub(crate) fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.lost.subscribe();
        let session_lost = self.session.shared().lost();
        async move {
            let own = async {
                let res = rx.wait_for(|v| v.is_some()).await.map(|v| v.expect("some"));
                match res {
                    Ok(r) => r,
                    Err(_) => futures::future::pending().await,
                }
            };
            tokio::select! {
                r = own => r,
                r = session_lost => r,
            }
        }
    }

    /// Fails unless the entry is still held.
    pub(crate) fn check_held(&self) -> Result<()> {
        match self.lost_reason() {
            None => Ok(()),
            Some(r) => Err(lost_error(r)),
        }
    }

    /// Deletes the entry and confirms it; a second call fails with [`Error::NotHeld`].
    pub(crate) async fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Err(Error::NotHeld("already released"));
        }
        let lost_before = self.lost_reason();
        self.watcher.cancel();
        self.lost.send_if_modified(|v| {
            v.is_none() && {
                *v = Some(LostReason::Released);
                true
            }
        });
        let shared = self.session.shared();
        let span = info_span!(parent: &shared.span, "release", key = %self.entry.key, token = %self.entry.token);
        let remote = shared.remote.clone();
        let res = with_retry(shared, || remote.remove(&self.entry))
            .instrument(span)
            .await;
        match (res, lost_before) {
            (Ok(true), None) => {
                self.drop_local();
                Ok(())
            }
            (Ok(_), Some(r)) | (Err(_), Some(r)) => {
                self.drop_local();
                Err(lost_error(r))
            }
            (Ok(false), None) => {
                self.drop_local();
                Err(lost_error(LostReason::EntryDeleted))
            }
            (Err(e), None) => Err(e), // Drop hands the removal to the background task.
        }
    }

    fn drop_local(&self) {
        let local = self.local.lock().unwrap().take();
        drop(local);
        self.session.shared().trim_local_queue(&self.queue);
    }
}

fn lost_error(r: LostReason) -> Error {
    match r {
        LostReason::EntryDeleted => Error::NotHeld("our entry was deleted by someone else"),
        LostReason::Released => Error::NotHeld("already released"),
        r => Error::SessionLost(r),
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.watcher.cancel();
        let local = self.local.get_mut().unwrap().take();
        if local.is_some() {
            // Never blocks, needs no runtime: the background task deletes the entry, then
            // lets the next local waiter go.
            self.session.shared().hand_off(Cleanup::Remove {
                queue: self.queue.clone(),
                entry: self.entry.clone(),
                local,
            });
        }
    }
}
