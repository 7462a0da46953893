//! The session: one lease / ZooKeeper session per process, one heartbeat for every lock.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch, OwnedMutexGuard};
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info_span, warn, Instrument};
use uuid::Uuid;

use crate::backend::{Backend, BackendSession, Entry, QueueId, QueueKind, SessionEvent};
use crate::name::{validate_name, validate_namespace};
use crate::{Election, Error, Mutex, Result};

/// Why a session, a guard or a leadership stopped being held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The cluster reported that the session expired.
    Expired,
    /// No heartbeat was confirmed before the local deadline (`ttl − safety margin` after the
    /// last confirmed heartbeat was sent): we step down by our own clock, before the cluster
    /// can grant the lock to someone else.
    LocalDeadline,
    /// Our entry was deleted by someone else (an operator, another tool).
    EntryDeleted,
    /// The session was closed with [`Session::close`].
    Closed,
    /// The guard or leadership was released or resigned by its owner.
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the cluster expired the session",
            LostReason::LocalDeadline => "no heartbeat confirmed before the local deadline",
            LostReason::EntryDeleted => "our entry was deleted by someone else",
            LostReason::Closed => "the session was closed",
            LostReason::Released => "released by its owner",
        })
    }
}

/// The observable state of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionState {
    /// The last heartbeat was confirmed; the local deadline is ahead.
    Live,
    /// A heartbeat failed or the connection dropped; the local deadline is still ahead, and
    /// heartbeats are retried. Locks are still held, but the holder should pause risky work.
    Suspended,
    /// Terminal: the session is gone. Start a new one.
    Lost(LostReason),
}

/// Builds a [`Session`]; see [`Session::builder`].
#[derive(Debug)]
pub struct SessionBuilder {
    backend: Arc<dyn Backend>,
    ttl: Duration,
    margin: Option<Duration>,
    namespace: String,
}

/// The default session TTL (10 s).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The default namespace (key prefix) of a session.
pub const DEFAULT_NAMESPACE: &str = "fencelock";

impl SessionBuilder {
    /// The session TTL: how long the cluster keeps the session without a heartbeat
    /// (default 10 s). Heartbeats go every `ttl / 3`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The safety margin subtracted from the TTL to get the local deadline
    /// (default `max(ttl / 5, 1 s)`, but at most `ttl / 2`). Must be below the TTL.
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

    /// Validates the settings, opens the session on the cluster and starts its heartbeat.
    pub async fn start(self) -> Result<Session> {
        validate_namespace(&self.namespace)?;
        let min = self.backend.min_ttl();
        if self.ttl < min {
            return Err(Error::InvalidTtl {
                ttl: self.ttl,
                reason: format!(
                    "below the {} backend's minimum of {min:?}",
                    self.backend.name()
                ),
            });
        }
        let span = info_span!(
            "session",
            backend = self.backend.name(),
            id = tracing::field::Empty
        );
        let sent = Instant::now();
        let remote = self
            .backend
            .open_session(self.ttl)
            .instrument(span.clone())
            .await?;
        span.record("id", remote.id());
        // The granted TTL may differ from the request (etcd raises it to its minimum,
        // ZooKeeper negotiates it): the deadline follows what the cluster enforces.
        let ttl = remote.ttl();
        let margin = match self.margin {
            Some(m) => m,
            None => (ttl / 5).max(Duration::from_secs(1)).min(ttl / 2),
        };
        if margin >= ttl {
            let _ = remote.close().await;
            return Err(Error::InvalidTtl {
                ttl,
                reason: format!("the safety margin {margin:?} must be below the ttl"),
            });
        }
        let (state_tx, _) = watch::channel(SessionState::Live);
        let (cleanup_tx, cleanup_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            backend_name: self.backend.name(),
            remote,
            namespace: self.namespace,
            ttl,
            margin,
            deadline: StdMutex::new(sent + ttl - margin),
            state: state_tx,
            stop: CancellationToken::new(),
            halted: AtomicBool::new(false),
            local: StdMutex::new(HashMap::new()),
            cleanup: cleanup_tx,
            span,
        });
        tokio::spawn(heartbeat(Arc::downgrade(&shared), shared.stop.clone()));
        tokio::spawn(cleanup_worker(shared.clone(), cleanup_rx));
        Ok(Session {
            handle: Arc::new(Handle { shared }),
        })
    }
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
            .field("backend", &self.shared().backend_name)
            .field("id", &self.id())
            .field("ttl", &self.shared().ttl)
            .field("state", &self.state())
            .finish()
    }
}

struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The heartbeat task sees this, closes the remote session and ends.
        self.shared.stop.cancel();
    }
}

pub(crate) struct Shared {
    pub(crate) backend_name: &'static str,
    pub(crate) remote: Arc<dyn BackendSession>,
    pub(crate) namespace: String,
    ttl: Duration,
    margin: Duration,
    deadline: StdMutex<Instant>,
    state: watch::Sender<SessionState>,
    stop: CancellationToken,
    halted: AtomicBool,
    local: StdMutex<HashMap<QueueId, Arc<tokio::sync::Mutex<()>>>>,
    cleanup: mpsc::UnboundedSender<Cleanup>,
    pub(crate) span: tracing::Span,
}

/// Work handed to the session's background task: it never blocks the caller.
pub(crate) enum Cleanup {
    /// Delete this entry (guarded by its token), then let the next local waiter go.
    Remove {
        queue: QueueId,
        entry: Entry,
        local: Option<OwnedMutexGuard<()>>,
    },
    /// Await the create request still in flight, then delete what it created.
    Enqueued {
        queue: QueueId,
        attempt: Uuid,
        inflight: crate::queue::EnqueueTask,
        local: Option<OwnedMutexGuard<()>>,
    },
    /// Delete whatever this attempt may have created.
    Abandon {
        queue: QueueId,
        attempt: Uuid,
        local: Option<OwnedMutexGuard<()>>,
    },
    /// Answer once every earlier item is done.
    Flush(oneshot::Sender<()>),
}

impl Session {
    /// Starts building a session on `backend`.
    pub fn builder(backend: impl IntoBackend) -> SessionBuilder {
        SessionBuilder {
            backend: backend.into_backend(),
            ttl: DEFAULT_TTL,
            margin: None,
            namespace: DEFAULT_NAMESPACE.to_string(),
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// A mutex named `name` in this session's namespace. The name is validated: non-empty,
    /// at most 512 bytes, no NUL or control characters, no leading or trailing `/`, no empty,
    /// `.` or `..` segments.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        validate_name(name)?;
        Ok(Mutex::new(self.clone(), self.queue(name, QueueKind::Lock)))
    }

    /// An election named `name` in this session's namespace (same name rules as
    /// [`mutex`](Self::mutex)).
    pub fn election(&self, name: &str) -> Result<Election> {
        validate_name(name)?;
        Ok(Election::new(
            self.clone(),
            self.queue(name, QueueKind::Election),
        ))
    }

    fn queue(&self, name: &str, kind: QueueKind) -> QueueId {
        QueueId {
            namespace: self.shared().namespace.clone(),
            name: name.to_string(),
            kind,
        }
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
        self.shared().backend_name
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

    /// The local deadline: the instant after which this process must consider every lock of
    /// the session lost, unless a heartbeat is confirmed before.
    pub fn deadline(&self) -> Instant {
        *self.shared().deadline.lock().unwrap()
    }

    /// Resolves when the session is lost, with the reason.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        self.shared().lost()
    }

    /// Closes the session on the cluster: every lock, waiter and candidacy it owns goes at
    /// once, and every guard's `lost()` fires with [`LostReason::Closed`].
    pub async fn close(&self) -> Result<()> {
        let shared = self.shared();
        if let SessionState::Lost(reason) = shared.state() {
            if reason == LostReason::Closed {
                return Ok(());
            }
        }
        shared.set_lost(LostReason::Closed);
        shared.stop.cancel();
        shared.remote.close().instrument(shared.span.clone()).await
    }

    /// Waits until every release handed to the background task (by dropped guards and
    /// cancelled acquisitions) has been carried out or abandoned with the session.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.shared().cleanup.send(Cleanup::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Lists every entry (of any session) under this session's namespace, sorted. Meant for
    /// inspection and for tests that prove no entry leaked.
    pub async fn list_entries(&self) -> Result<Vec<String>> {
        self.shared().remote.list(&self.shared().namespace).await
    }

    /// Fault injection for tests: stops sending heartbeats, as if the process were paused or
    /// cut off. The session then goes lost at its local deadline, and the cluster expires it
    /// after the TTL. There is no way back: the session is terminal.
    pub fn halt_heartbeats(&self) {
        self.shared().halted.store(true, Ordering::SeqCst);
    }
}

impl Shared {
    pub(crate) fn state(&self) -> SessionState {
        let state = *self.state.borrow();
        match state {
            SessionState::Lost(_) => state,
            _ if Instant::now() >= *self.deadline.lock().unwrap() => {
                SessionState::Lost(LostReason::LocalDeadline)
            }
            _ => state,
        }
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        match self.state() {
            SessionState::Lost(r) => Some(r),
            _ => None,
        }
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        match self.lost_reason() {
            Some(r) => Err(Error::SessionLost(r)),
            None => Ok(()),
        }
    }

    pub(crate) fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let mut rx = self.state.subscribe();
        async move {
            loop {
                if let SessionState::Lost(r) = *rx.borrow_and_update() {
                    return r;
                }
                if rx.changed().await.is_err() {
                    return LostReason::Closed;
                }
            }
        }
    }

    fn set_lost(&self, reason: LostReason) {
        self.state.send_if_modified(|s| {
            if matches!(s, SessionState::Lost(_)) {
                false
            } else {
                *s = SessionState::Lost(reason);
                true
            }
        });
    }

    fn set_state(&self, new: SessionState) {
        self.state.send_if_modified(|s| {
            if matches!(s, SessionState::Lost(_)) || *s == new {
                false
            } else {
                *s = new;
                true
            }
        });
    }

    /// The local FIFO queue of this session for `queue`.
    pub(crate) fn local_queue(&self, queue: &QueueId) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.local.lock().unwrap();
        map.entry(queue.clone()).or_default().clone()
    }

    /// Forgets the local queue of `queue` if nobody else uses it (keeps the map small).
    pub(crate) fn trim_local_queue(&self, queue: &QueueId) {
        let mut map = self.local.lock().unwrap();
        if let Some(q) = map.get(queue) {
            if Arc::strong_count(q) == 1 {
                map.remove(queue);
            }
        }
    }

    pub(crate) fn hand_off(&self, work: Cleanup) {
        // If the worker is gone the session is gone, and so are its entries.
        let _ = self.cleanup.send(work);
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

/// The heartbeat: keep-alive every ttl/3, local deadline from the send time of the last
/// confirmed heartbeat, cluster events. Holds only a weak reference so that dropping the last
/// handle ends it.
async fn heartbeat(weak: Weak<Shared>, stop: CancellationToken) {
    let Some(shared) = weak.upgrade() else { return };
    let span = shared.span.clone();
    let remote = shared.remote.clone();
    let ttl = shared.ttl;
    let margin = shared.margin;
    drop(shared);
    let retry = (ttl / 10).clamp(Duration::from_millis(50), Duration::from_millis(500));
    let mut next = Instant::now() + ttl / 3;
    async move {
        loop {
            let Some(shared) = weak.upgrade() else { return };
            let deadline = *shared.deadline.lock().unwrap();
            let halted = shared.halted.load(Ordering::SeqCst);
            drop(shared);
            tokio::select! {
                biased;
                _ = stop.cancelled() => {
                    if let Some(shared) = weak.upgrade() {
                        if shared.lost_reason().is_none() {
                            shared.set_lost(LostReason::Closed);
                        }
                    }
                    // Best effort: free every entry now rather than after the TTL.
                    let _ = tokio::time::timeout(ttl, remote.close()).await;
                    return;
                }
                _ = sleep_until(deadline) => {
                    warn!("local deadline passed without a confirmed heartbeat: session lost");
                    if let Some(shared) = weak.upgrade() {
                        shared.set_lost(LostReason::LocalDeadline);
                    }
                    // Free our entries now rather than at the cluster's expiry — unless the
                    // heartbeats were halted to play a paused process, which sends nothing.
                    if !halted {
                        let _ = tokio::time::timeout(ttl, remote.close()).await;
                    }
                    return;
                }
                ev = remote.next_event() => {
                    let Some(shared) = weak.upgrade() else { return };
                    match ev {
                        SessionEvent::Expired => {
                            warn!("cluster reports the session expired");
                            shared.set_lost(LostReason::Expired);
                            return;
                        }
                        SessionEvent::Disconnected => shared.set_state(SessionState::Suspended),
                        // Confirm with a heartbeat right away.
                        SessionEvent::Reconnected => next = Instant::now(),
                    }
                }
                _ = sleep_until(next), if !halted => {
                    if weak.upgrade().is_none_or(|s| s.halted.load(Ordering::SeqCst)) {
                        continue;
                    }
                    let sent = Instant::now();
                    match timeout_at(deadline, remote.keep_alive()).await {
                        Ok(Ok(())) => {
                            let Some(shared) = weak.upgrade() else { return };
                            *shared.deadline.lock().unwrap() = sent + ttl - margin;
                            shared.set_state(SessionState::Live);
                            next = sent + ttl / 3;
                        }
                        Ok(Err(Error::SessionLost(reason))) => {
                            warn!(%reason, "heartbeat refused: session lost");
                            if let Some(shared) = weak.upgrade() {
                                shared.set_lost(reason);
                            }
                            return;
                        }
                        Ok(Err(e)) => {
                            debug!(error = %e, "heartbeat failed: suspended");
                            if let Some(shared) = weak.upgrade() {
                                shared.set_state(SessionState::Suspended);
                            }
                            next = Instant::now() + retry;
                        }
                        Err(_) => next = Instant::now(),
                    }
                }
            }
        }
    }
    .instrument(span)
    .await
}

/// Carries out releases handed over by dropped guards and cancelled acquisitions, in order,
/// retrying temporary errors until the session is lost.
async fn cleanup_worker(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Cleanup>) {
    let span = shared.span.clone();
    let remote = shared.remote.clone();
    let stop = shared.stop.clone();
    let weak = Arc::downgrade(&shared);
    drop(shared);
    async move {
        while let Some(work) = rx.recv().await {
            match work {
                Cleanup::Flush(tx) => {
                    let _ = tx.send(());
                }
                Cleanup::Remove {
                    queue,
                    entry,
                    local,
                } => {
                    let span = info_span!("release", key = %entry.key, token = %entry.token);
                    retry_until_lost(&weak, &stop, || remote.remove(&entry))
                        .instrument(span)
                        .await;
                    drop(local);
                    trim(&weak, &queue);
                }
                Cleanup::Enqueued {
                    queue,
                    attempt,
                    inflight,
                    local,
                } => {
                    let span = info_span!("abandon", queue = %queue);
                    match inflight.await {
                        Ok(Ok((entry, _))) => {
                            retry_until_lost(&weak, &stop, || remote.remove(&entry))
                                .instrument(span)
                                .await
                        }
                        _ => {
                            retry_until_lost(&weak, &stop, || remote.abandon(&queue, attempt))
                                .instrument(span)
                                .await
                        }
                    }
                    drop(local);
                    trim(&weak, &queue);
                }
                Cleanup::Abandon {
                    queue,
                    attempt,
                    local,
                } => {
                    let span = info_span!("abandon", queue = %queue);
                    retry_until_lost(&weak, &stop, || remote.abandon(&queue, attempt))
                        .instrument(span)
                        .await;
                    drop(local);
                    trim(&weak, &queue);
                }
            }
        }
    }
    .instrument(span)
    .await
}

fn trim(weak: &Weak<Shared>, queue: &QueueId) {
    if let Some(shared) = weak.upgrade() {
        shared.trim_local_queue(queue);
    }
}

async fn retry_until_lost<T, F, Fut>(weak: &Weak<Shared>, stop: &CancellationToken, mut op: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut backoff = Duration::from_millis(20);
    loop {
        match op().await {
            Ok(_) => return,
            Err(e) => {
                let gone = weak.upgrade().is_none_or(|s| s.lost_reason().is_some());
                if gone || stop.is_cancelled() || !e.is_temporary() {
                    debug!(error = %e, "background release given up (the session takes the entry with it)");
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}
