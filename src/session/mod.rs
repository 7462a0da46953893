//! The session: one lease / ZooKeeper session per process, one heartbeat for every lock.

mod cleanup;
mod clock;
mod handoff;
mod heartbeat;
mod local;
mod shared;
mod state;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout_at, Instant};
use tracing::{debug, info_span, Instrument};

pub(crate) use handoff::{Cleanup, EnqueueAllTask, EnqueueTask};
pub(crate) use local::{LocalQueue, LocalSlot};
pub(crate) use shared::Shared;
pub use state::{LostReason, SessionEnd, SessionState};

use crate::backend::{Backend, QueueId, QueueKind};
use crate::name::{validate_name, validate_namespace};
use crate::retry::Backoff;
use crate::{Error, Result};

/// The default session TTL (10 s).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The default namespace (key prefix) of a session.
pub const DEFAULT_NAMESPACE: &str = "fencelock";
/// How long [`SessionBuilder::start`] keeps trying by default when the cluster is unreachable
/// (10 s).
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`Session`]; see [`Session::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `start()` is awaited"]
#[derive(Clone)]
pub struct SessionBuilder {
    backend: Arc<dyn Backend>,
    ttl: Duration,
    margin: Option<Duration>,
    namespace: String,
    start_timeout: Duration,
    metrics_names: bool,
}

impl SessionBuilder {
    /// The session TTL: how long the cluster keeps the session without a heartbeat
    /// (default 10 s). Heartbeats go every `ttl / 3`. Must lie between the backend's minimum
    /// and maximum ([`Error::InvalidTtl`] otherwise).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The safety margin subtracted from the TTL to get the local deadline (default
    /// `max(ttl / 5, 1 s)`, but at most `ttl / 2`). Must be positive (a zero margin leaves no
    /// room for the client's and the cluster's clocks to run at different rates) and below the
    /// TTL the cluster grants; [`Error::InvalidTtl`] otherwise.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// The key prefix under which every lock and election of this session lives
    /// (default `"fencelock"`). An empty namespace gives keys `/{name}/...`, the layout of
    /// etcd's Go `concurrency` package for a prefix `/{name}`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Whether the acquisition metrics (see [`crate::metrics`]) carry the lock's name as a
    /// `name` label (default off: one series per lock name can be a lot of series).
    pub fn metrics_lock_names(mut self, on: bool) -> Self {
        self.metrics_names = on;
        self
    }

    /// How long [`start`](Self::start) keeps trying while the cluster answers with temporary
    /// errors (unreachable, electing a leader) before it gives up with the last one (default
    /// [`DEFAULT_START_TIMEOUT`]). Permanent errors (authentication, permissions, bad
    /// settings) are returned at once.
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

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
        let backend = self.backend;
        validate_namespace(&self.namespace)?;
        backend.check_namespace(&self.namespace)?;
        check_ttl(&*backend, self.ttl)?;
        if let Some(m) = self.margin {
            check_margin(m, self.ttl)?;
        }
        let span = info_span!(
            "session",
            backend = backend.name(),
            id = tracing::field::Empty
        );
        let give_up = Instant::now().checked_add(self.start_timeout);
        // Retried about as often as the session's own loops would: a cluster electing a leader
        // is noticed within a twentieth of the TTL.
        let mut backoff = Backoff::for_ttl(self.ttl);
        let clock = clock::Clock::default();
        let (sent, remote) = loop {
            let sent = clock.now();
            match backend
                .open_session(self.ttl)
                .instrument(span.clone())
                .await
            {
                Ok(remote) => break (sent, remote),
                Err(e) if e.is_temporary() => {
                    let pause = backoff.next_delay();
                    if give_up.is_some_and(|g| Instant::now() + pause >= g) {
                        return Err(e);
                    }
                    debug!(error = %e, "cannot open the session yet, retrying");
                    tokio::time::sleep(pause).await;
                }
                Err(e) => return Err(e),
            }
        };
        span.record("id", remote.id());
        // The granted TTL may differ from the request (etcd raises it to its minimum,
        // ZooKeeper negotiates it): the deadline follows what the cluster enforces.
        let ttl = remote.ttl();
        let margin = self
            .margin
            .unwrap_or_else(|| (ttl / 5).max(Duration::from_secs(1)).min(ttl / 2));
        if let Err(e) = check_margin(margin, ttl) {
            let _ = remote.close().await;
            return Err(e);
        }
        let mut deadline = sent.after(ttl - margin);
        // On both clocks: a machine suspended while opening counts as a slow open.
        if clock.passed(sent.after(ttl / 3)) {
            // A slow open: confirm the session now rather than hand out one whose deadline is
            // near (or past).
            let again = clock.now();
            let patience = deadline.mono.max(again.mono + (ttl - margin));
            match timeout_at(patience, remote.keep_alive()).await {
                Ok(Ok(())) => deadline = again.after(ttl - margin),
                Ok(Err(e)) => {
                    let _ = remote.close().await;
                    return Err(e);
                }
                Err(_) => {
                    let _ = remote.close().await;
                    return Err(Error::Timeout {
                        op: "first heartbeat",
                        after: ttl - margin,
                    });
                }
            }
        }
        let (cleanup_tx, cleanup_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::new(
            backend,
            remote,
            self.namespace,
            ttl,
            margin,
            clock,
            deadline,
            cleanup_tx,
            span,
            self.metrics_names,
        ));
        tokio::spawn(heartbeat::run(Arc::downgrade(&shared), shared.stop.clone()));
        tokio::spawn(cleanup::worker(shared.clone(), cleanup_rx));
        Ok(Session {
            handle: Arc::new(Handle { shared }),
        })
    }
}

fn check_ttl(backend: &dyn Backend, ttl: Duration) -> Result<()> {
    let (min, max) = (backend.min_ttl(), backend.max_ttl());
    if ttl < min {
        return Err(Error::invalid_ttl(
            ttl,
            format!("below the {} backend's minimum of {min:?}", backend.name()),
        ));
    }
    if ttl > max {
        return Err(Error::invalid_ttl(
            ttl,
            format!("above the {} backend's maximum of {max:?}", backend.name()),
        ));
    }
    Ok(())
}

fn check_margin(margin: Duration, ttl: Duration) -> Result<()> {
    if margin.is_zero() {
        return Err(Error::invalid_ttl(
            margin,
            "the safety margin must be positive: it is the room left for clock drift",
        ));
    }
    if margin >= ttl {
        return Err(Error::invalid_ttl(
            margin,
            format!("the safety margin must be below the ttl ({ttl:?})"),
        ));
    }
    Ok(())
}

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
        // The heartbeat task sees this, closes the remote session and ends.
        self.shared.stop.cancel();
    }
}

impl Session {
    /// Starts building a session on `backend`.
    pub fn builder(backend: impl IntoBackend) -> SessionBuilder {
        SessionBuilder {
            backend: backend.into_backend(),
            ttl: DEFAULT_TTL,
            margin: None,
            namespace: DEFAULT_NAMESPACE.to_string(),
            start_timeout: DEFAULT_START_TIMEOUT,
            metrics_names: false,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// Validates `name` for this session's backend and namespace and makes its queue id: the
    /// name rules of [`Session::mutex`](crate::Session::mutex), for every primitive.
    pub(crate) fn queue(&self, name: &str, kind: QueueKind) -> Result<QueueId> {
        validate_name(name)?;
        let shared = self.shared();
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

    /// The backend tag (`"etcd"`, `"zookeeper"`, `"memory"`).
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
    pub fn deadline(&self) -> Instant {
        self.shared().deadline()
    }

    /// Resolves when the session is lost, with the reason.
    pub fn lost(&self) -> impl Future<Output = SessionEnd> + Send + 'static {
        self.shared().lost()
    }

    /// Closes the session on the cluster: every lock, waiter and candidacy it owns goes at
    /// once, and every guard's `lost()` fires with
    /// [`LostReason::Session`]`(`[`SessionEnd::Closed`]`)`. Closing a closed or lost session
    /// does nothing.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the session all the same: from the first poll it is lost
    /// here (`Lost(Closed)`), and its background task ends it on the cluster, retrying while
    /// the cluster is unreachable. Only the confirmation is lost with the future.
    pub async fn close(&self) -> Result<()> {
        let shared = self.shared();
        if shared.end().is_some() {
            return Ok(());
        }
        shared.set_lost(SessionEnd::Closed);
        shared.stop.cancel();
        shared.remote.close().instrument(shared.span.clone()).await
    }

    /// Waits until every release handed to the background task (by dropped guards and
    /// cancelled acquisitions) has been carried out or abandoned with the session.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        self.shared().hand_off(Cleanup::Flush(tx));
        let _ = rx.await;
    }

    /// Lists every entry (of any session) under this session's namespace, sorted. Meant for
    /// inspection and for tests that prove no entry leaked.
    pub async fn list_entries(&self) -> Result<Vec<String>> {
        let shared = self.shared();
        shared.retry(|| shared.remote.list(&shared.namespace)).await
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

/// Anything that can be turned into a shared backend: a backend value or an `Arc` of one.
pub trait IntoBackend {
    /// Converts into `Arc<dyn Backend>`.
    fn into_backend(self) -> Arc<dyn Backend>;
}

impl<B: Backend> IntoBackend for B {
    fn into_backend(self) -> Arc<dyn Backend> {
        Arc::new(self)
    }
}

impl IntoBackend for Arc<dyn Backend> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}
