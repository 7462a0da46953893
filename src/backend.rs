//! The trait a backend implements. Nothing in the core knows etcd or ZooKeeper.
//!
//! A backend provides *sessions* (an etcd lease, a ZooKeeper session, ...). A session owns
//! *entries* in ordered *queues*: one queue per lock or election, one entry per session per
//! queue (the core queues tasks of one session locally first). The core runs the wait loop
//! (find the predecessor, wait until it is gone, repeat) and the session's heartbeat; the
//! backend only supplies these primitives.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use crate::{FencingToken, Result};

/// What a queue is used for: it only changes the entry naming on backends that follow a
/// foreign layout (ZooKeeper: Curator's `-lock-` versus `-latch-`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QueueKind {
    /// A mutex queue.
    Lock,
    /// A leader-election queue.
    Election,
}

/// Identifies one queue: `{namespace}/{name}` of a given kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueId {
    /// The session's namespace (a validated key prefix; may be empty).
    pub namespace: String,
    /// The validated lock or election name.
    pub name: String,
    /// What the queue is for.
    pub kind: QueueKind,
}

impl QueueId {
    /// The queue's directory path: `{namespace}/{name}`, or `/{name}` for an empty namespace
    /// (the layout of etcd's Go `concurrency` package for a prefix `/{name}`).
    pub fn path(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path())
    }
}

/// One entry of a queue, as the backend knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The full key or node path.
    pub key: String,
    /// The entry's fencing token (etcd create revision, ZooKeeper czxid).
    pub token: FencingToken,
    /// The entry's position in the queue (etcd create revision, ZooKeeper sequence number):
    /// smaller is earlier.
    pub order: u64,
}

/// A heartbeat or session-level outcome reported by a backend session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// The cluster reports the session expired (terminal).
    Expired,
    /// The connection to the cluster dropped; the session may still be alive.
    Disconnected,
    /// The connection came back and the session is still alive.
    Reconnected,
}

/// A backend: a factory of sessions. Object safe; used as `Arc<dyn Backend>`.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// A short tag used in errors and traces (`"etcd"`, `"zookeeper"`, `"memory"`).
    fn name(&self) -> &'static str;

    /// The smallest TTL this backend accepts.
    fn min_ttl(&self) -> Duration;

    /// Creates a session (lease / ZooKeeper session) with the requested TTL. The returned
    /// session reports the TTL actually granted or negotiated.
    async fn open_session(&self, ttl: Duration) -> Result<Arc<dyn BackendSession>>;
}

/// One session on the cluster. Every entry it creates is ephemeral: it goes when the session
/// goes.
#[async_trait]
pub trait BackendSession: Send + Sync + fmt::Debug + 'static {
    /// The session's id as the cluster knows it (lease id in hex, ZooKeeper session id).
    fn id(&self) -> String;

    /// The TTL granted (etcd) or negotiated (ZooKeeper).
    fn ttl(&self) -> Duration;

    /// Sends one heartbeat and waits for its confirmation. `Ok(())` means the cluster confirmed
    /// the session alive *after* the call started. An error whose
    /// [`is_temporary`](crate::Error::is_temporary) is false and that is
    /// [`Error::SessionLost`](crate::Error::SessionLost) means the cluster expired it.
    async fn keep_alive(&self) -> Result<()>;

    /// Waits for the next session-level event pushed by the cluster connection (ZooKeeper
    /// session states). Backends without such events never resolve (the default).
    async fn next_event(&self) -> SessionEvent {
        futures::future::pending().await
    }

    /// Creates this session's entry in `queue` carrying `value`, or finds it again if an
    /// earlier attempt with the same `attempt` id already created it (the
    /// create-succeeded-but-reply-lost case). Returns the entry and whether it is the head of
    /// the queue (backends answer both in one round trip where they can).
    async fn enqueue(&self, queue: &QueueId, attempt: Uuid, value: &[u8]) -> Result<(Entry, bool)>;

    /// The entry just before `entry` in its queue, or `None` if `entry` is the head.
    /// Fails with [`Error::EntryVanished`](crate::Error::EntryVanished) if `entry` itself is
    /// gone.
    async fn predecessor(&self, queue: &QueueId, entry: &Entry) -> Result<Option<Entry>>;

    /// Resolves once `entry` no longer exists (deleted, expired, or replaced by a newer entry
    /// with the same key). Returns at once if it is already gone. Must not miss a deletion that
    /// happens while the call is starting.
    async fn wait_gone(&self, entry: &Entry) -> Result<()>;

    /// Deletes `entry` if it is still the same entry (guarded by its token). Returns whether
    /// it deleted anything. Never deletes a newer entry with the same key.
    async fn remove(&self, entry: &Entry) -> Result<bool>;

    /// Deletes whatever entry attempt `attempt` of this session created in `queue`, when the
    /// caller does not know whether the create happened (a cancelled enqueue).
    async fn abandon(&self, queue: &QueueId, attempt: Uuid) -> Result<()>;

    /// Replaces the value of `entry` if it is still the same entry. Returns `false` if it is
    /// gone.
    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<bool>;

    /// The head of `queue` and its value, or `None` if the queue is empty.
    async fn head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>>;

    /// Resolves when `queue` changes relative to `seen` (the head and value last read by
    /// [`head`](Self::head)): an entry is added or removed, or the head's value changes.
    /// Returns at once if the queue already differs from `seen`.
    async fn wait_queue_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()>;

    /// Lists the keys of every entry (of any session) under `namespace`, sorted. For
    /// inspection and for tests that prove no entry leaked.
    async fn list(&self, namespace: &str) -> Result<Vec<String>>;

    /// Ends the session on the cluster: every entry it owns goes at once.
    async fn close(&self) -> Result<()>;
}
