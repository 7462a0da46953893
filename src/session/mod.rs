//! The session: one lease / ZooKeeper session per process, one heartbeat for every lock.

mod builder;
mod cleanup;
pub(crate) mod clock;
#[cfg(all(test, feature = "testing"))]
mod close_once_lost_tests;
mod handoff;
mod heartbeat;
mod local;
mod shared;
mod state;
mod undo;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

pub use builder::{
    IntoBackend, SessionBuilder, DEFAULT_NAMESPACE, DEFAULT_START_TIMEOUT, DEFAULT_TTL,
};
pub(crate) use handoff::Cleanup;
pub(crate) use local::{LocalQueue, LocalSlot};
use shared::CloseClaim;
pub(crate) use shared::Shared;
pub use state::{LostReason, SessionEnd, SessionState};
pub(crate) use undo::{in_flight, EnqueueAllTask, EnqueueTask, InFlight, Undo};

use crate::backend::{QueueId, QueueKind};
use crate::name::validate_name;
use crate::Result;

/// A session on the cluster: one etcd lease or one ZooKeeper session, kept alive by one
/// heartbeat, carrying every lock and candidacy of the process.
///
/// Cheap to clone. When the last clone (and every mutex, guard and election made from it) is
/// dropped, the session is closed in the background.
///
/// ```
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock::{MemoryBackend, Session};
///
/// let session = Session::builder(MemoryBackend::new())
///     .ttl(Duration::from_secs(10))
///     .start()
///     .await?;
/// let guard = session.mutex("jobs/reindex")?.lock().await?;
/// println!("holding with token {}", guard.token());
/// guard.release().await?;
/// session.close().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Session {
    handle: Arc<Handle>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("backend", &self.shared().backend_name())
            .field("id", &self.id())
            .field("ttl", &self.shared().ttl)
            .field("state", &self.state())
            .finish()
    }
}

/// Closes the session when the last handle goes.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Closed here, not by the heartbeat task: it may find the session's state gone once
        // it looks (the metrics' count of open sessions would keep it).
        self.shared.set_lost(SessionEnd::Closed);
        // The heartbeat task sees this, closes the remote session and ends.
        self.shared.stop.cancel();
    }
}

impl Session {
    /// Starts building a session on `backend`.
    pub fn builder(backend: impl IntoBackend) -> SessionBuilder {
        SessionBuilder::new(backend.into_backend())
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// Validates `name` for this session's backend and namespace and makes its queue id: the
    /// name rules of [`Session::mutex`](crate::Session::mutex), for every primitive.
    pub(crate) fn queue(&self, name: &str, kind: QueueKind) -> Result<QueueId> {
        let shared = self.shared();
        crate::name::validate_name_in(&shared.namespace, name)?;
        shared.backend.check_name(&shared.namespace, name)?;
        Ok(QueueId::new(shared.namespace.clone(), name, kind))
    }

    /// The queue `{name}/{suffix}` of a primitive made of several queues (a semaphore's gate
    /// and leases). The user's `name` is held to the rules of every name, so that such a
    /// primitive accepts every name a mutex does: the suffix is ours, and does not count
    /// against [`MAX_NAME_LEN`](crate::MAX_NAME_LEN).
    pub(crate) fn sub_queue(&self, name: &str, suffix: &str, kind: QueueKind) -> Result<QueueId> {
        validate_name(name)?;
        self.found_queue(&format!("{name}/{suffix}"), kind)
    }

    /// The queue id of a queue name the core made ([`sub_queue`](Self::sub_queue)) or read
    /// back from the cluster's listing: a name as [`queue`](Self::queue) accepts, or one with
    /// a primitive's suffix.
    pub(crate) fn found_queue(&self, name: &str, kind: QueueKind) -> Result<QueueId> {
        crate::name::validate_queue_name(name)?;
        let shared = self.shared();
        shared.backend.check_name(&shared.namespace, name)?;
        Ok(QueueId::new(shared.namespace.clone(), name, kind))
    }

    /// The session id as the cluster knows it (etcd lease id in hex, ZooKeeper session id).
    pub fn id(&self) -> String {
        self.shared().remote.id()
    }

    /// The TTL granted or negotiated by the cluster.
    pub fn ttl(&self) -> Duration {
        self.shared().ttl
    }

    /// The safety margin in force.
    pub fn safety_margin(&self) -> Duration {
        self.shared().margin
    }

    /// The backend tag (`"etcd"`, `"zookeeper"`, `"redis"`, `"memory"`).
    pub fn backend_name(&self) -> &'static str {
        self.shared().backend_name()
    }

    /// The namespace (key prefix) of this session.
    pub fn namespace(&self) -> &str {
        &self.shared().namespace
    }

    /// The current state. Past the local deadline this reports
    /// `Lost(LocalDeadline)` even before the background task has noticed.
    pub fn state(&self) -> SessionState {
        self.shared().state()
    }

    /// The state now, then every change: `Live` ⇄ `Suspended`, and finally `Lost` with its
    /// reason, after which the stream ends. Intermediate states may be skipped when they
    /// change faster than the stream is read; the last state is never skipped.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> fencelock::Result<()> {
    /// use futures_util::StreamExt;
    /// use fencelock::{MemoryBackend, Session, SessionEnd, SessionState};
    ///
    /// let session = Session::builder(MemoryBackend::new()).start().await?;
    /// let mut states = Box::pin(session.state_changes());
    /// assert_eq!(states.next().await, Some(SessionState::Live));
    /// session.close().await?;
    /// assert_eq!(states.next().await, Some(SessionState::Lost(SessionEnd::Closed)));
    /// assert_eq!(states.next().await, None);
    /// # Ok(()) }
    /// ```
    pub fn state_changes(&self) -> impl Stream<Item = SessionState> + Send + 'static {
        let shared = Arc::downgrade(self.shared());
        let rx = self.shared().state.subscribe();
        // (receiver, whether the current value was reported, whether Lost was reported)
        futures_util::stream::unfold((rx, false, false), move |(mut rx, first, ended)| {
            let shared = shared.clone();
            async move {
                if ended {
                    return None;
                }
                if first && rx.changed().await.is_err() {
                    // The session is gone: report it once.
                    let end = shared
                        .upgrade()
                        .and_then(|s| s.end())
                        .unwrap_or(SessionEnd::Closed);
                    return Some((SessionState::Lost(end), (rx, true, true)));
                }
                let mut state = *rx.borrow_and_update();
                if !first {
                    // The state as of now: a session past its deadline is lost even before
                    // its background task has said so.
                    state = shared.upgrade().map_or(state, |s| s.state());
                }
                let lost = matches!(state, SessionState::Lost(_));
                Some((state, (rx, true, lost)))
            }
        })
    }

    /// The local deadline: the instant after which this process must consider every lock of
    /// the session lost, unless a heartbeat is confirmed before.
    ///
    /// On Tokio's clock, which stops while the machine is suspended (a laptop's sleep, a
    /// paused VM): after a resume, `deadline()` can still lie ahead of a session that is lost.
    /// The session itself counts the suspend too ([`state`](Self::state), `is_held()` and
    /// `lost()` say so at once): ask them, not the time left until this instant.
    pub fn deadline(&self) -> Instant {
        self.shared().deadline()
    }

    /// Resolves when the session is lost, with the reason: when the heartbeat task or the
    /// cluster says so, or as soon as the local [`deadline`](Self::deadline) has passed
    /// (checked whenever it is polled, so that work raced against it never runs a step past
    /// the deadline, even where the heartbeat task has not run yet: after a process stop or
    /// on a busy runtime).
    pub fn lost(&self) -> impl Future<Output = SessionEnd> + Send + 'static {
        self.shared().lost()
    }

    /// Closes the session on the cluster: every lock, waiter and candidacy it owns goes at
    /// once, and every guard's `lost()` fires with
    /// [`LostReason::Session`]`(`[`SessionEnd::Closed`]`)`. Closing a closed or lost session
    /// does nothing, but for one lost and left for this close: by its local deadline with
    /// [`close_at_deadline(false)`](crate::SessionBuilder::close_at_deadline), or as its
    /// heartbeat task went with its runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the session all the same: from the first poll it is lost
    /// here (`Lost(Closed)`), and a background task ends it on the cluster, retrying while
    /// the cluster is unreachable. Only the confirmation is lost with the future.
    pub async fn close(&self) -> Result<()> {
        let shared = self.shared();
        match shared.claim_close() {
            CloseClaim::Nothing => Ok(()),
            CloseClaim::Live => {
                // The heartbeat task sees this and ends the session too, retrying.
                shared.stop.cancel();
                shared.remote.close().instrument(shared.span.clone()).await
            }
            CloseClaim::Unclosed => {
                shared.stop.cancel();
                // No heartbeat task ends it: a task of its own does, which goes on retrying
                // temporary errors whether this future is polled to the end or not.
                let (tx, rx) = oneshot::channel();
                let (remote, ttl) = (shared.remote.clone(), shared.ttl);
                tokio::spawn(
                    async move {
                        let first = remote.close().await;
                        let again = first.as_ref().is_err_and(crate::Error::is_temporary);
                        let _ = tx.send(first);
                        if again {
                            heartbeat::close_patiently(&*remote, ttl).await;
                        }
                    }
                    .instrument(shared.span.clone()),
                );
                rx.await.unwrap_or(Ok(()))
            }
        }
    }

    /// Waits until every release handed to the background task (by dropped guards and
    /// cancelled acquisitions) has been carried out or abandoned with the session.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        self.shared().hand_off(Cleanup::Flush(tx));
        let _ = rx.await;
    }

    /// Lists every entry (of any session) under this session's namespace, sorted. Meant for
    /// inspection and for tests that prove no entry leaked. Its cost grows with the namespace:
    /// on ZooKeeper it reads every node below it, at most 32 requests out at once on the
    /// session's connection, so that its heartbeat waits behind a few of them, not behind a
    /// listing of a million nodes.
    pub async fn list_entries(&self) -> Result<Vec<String>> {
        let shared = self.shared();
        shared
            .retry_read(|| shared.remote.list(&shared.namespace))
            .await
    }

    /// **Testing only** (feature `testing`; not a stable API): stops sending heartbeats, as if
    /// the process were paused or cut off. The session then goes lost at its local deadline,
    /// and the cluster expires it after the TTL. There is no way back: the session is terminal.
    #[cfg(feature = "testing")]
    pub fn halt_heartbeats(&self) {
        self.shared()
            .halted
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// **Testing only** (feature `testing`; not a stable API): plays a suspend of the machine
    /// for `d` (a laptop lid closed, a VM paused by its host): the clock that keeps counting
    /// through suspend (`CLOCK_BOOTTIME` on Linux) jumps ahead by `d`, the monotonic clock and
    /// Tokio's timers do not. A suspend past the local deadline loses the session at once in
    /// [`state`](Self::state) and every guard's `is_held()`, and its `lost()` futures fire
    /// within a heartbeat period.
    #[cfg(feature = "testing")]
    pub fn simulate_suspend(&self, d: Duration) {
        self.shared().clock.suspend(d);
    }
}

impl SessionBuilder {
    /// Validates the settings, opens the session on the cluster and starts its heartbeat.
    ///
    /// The returned session is live, with its local deadline ahead: if opening took longer
    /// than a heartbeat interval (a slow connect), a heartbeat is confirmed before it returns,
    /// and a session that cannot be confirmed in time is closed and reported as an error, never
    /// handed out lost.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it returns leaves no session here. A session the cluster
    /// opened meanwhile owns nothing (no lock, no candidacy) and stays on the cluster until its
    /// TTL runs out there.
    pub async fn start(self) -> Result<Session> {
        let shared = self.open().await?;
        Ok(Session {
            handle: Arc::new(Handle { shared }),
        })
    }
}
