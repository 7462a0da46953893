//! The values that cross the backend interface.

use std::fmt;

use uuid::Uuid;

use crate::FencingToken;

/// What a queue is used for. It decides the entry naming on backends that follow a foreign
/// layout (ZooKeeper: Curator's `-lock-`, `-latch-`, `__READ__`/`__WRIT__`, `-lease-`) and never
/// the ordering rules, which the core applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QueueKind {
    /// A mutex queue: every entry is [`EntryKind::Exclusive`].
    Lock,
    /// A leader-election queue: every entry is [`EntryKind::Exclusive`] and carries a value.
    Election,
    /// A read-write lock: readers are [`EntryKind::Shared`], writers [`EntryKind::Exclusive`],
    /// in one order.
    ReadWrite,
    /// A counting semaphore: every entry is a [`EntryKind::Shared`] permit request.
    Semaphore,
}

/// The kind of one entry of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EntryKind {
    /// Excludes every other entry: a mutex waiter, an election candidate, a writer.
    Exclusive,
    /// Compatible with other shared entries: a reader, a semaphore permit.
    Shared,
}

/// Identifies one queue: `{namespace}/{name}`, used as a `kind` queue.
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
    /// A queue id from its parts (the caller has validated them).
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, kind: QueueKind) -> Self {
        QueueId {
            namespace: namespace.into(),
            name: name.into(),
            kind,
        }
    }

    /// The queue's directory path: `{namespace}/{name}`, or `/{name}` for an empty namespace
    /// (the layout of etcd's Go `concurrency` package for a prefix `/{name}`).
    pub fn path(&self) -> String {
        // Concatenated, not `format!`: made on every acquisition.
        [self.namespace.as_str(), "/", self.name.as_str()].concat()
    }
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path())
    }
}

/// An entry whose fencing token is known: one of this session's own entries, or a queue head
/// read with its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The full key or node path.
    pub key: String,
    /// The entry's fencing token (etcd create revision, ZooKeeper czxid).
    pub token: FencingToken,
    /// The entry's position in its queue (etcd create revision, ZooKeeper sequence number):
    /// smaller is earlier. Positions are never reused within one queue's lifetime on the
    /// cluster, except that a recreated ZooKeeper parent restarts its sequence; the key then
    /// differs.
    pub order: u64,
    /// Exclusive or shared.
    pub kind: EntryKind,
}

/// Another entry of a queue, as an enqueue saw it: enough to wait for it to go, and no token
/// (ZooKeeper's listing does not carry one, and nothing may be fenced with a peer's token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The full key or node path.
    pub key: String,
    /// The peer's position (as [`Entry::order`]); on etcd also what tells a re-created key
    /// with the same name apart.
    pub order: u64,
    /// Exclusive or shared.
    pub kind: EntryKind,
}

/// What [`BackendSession::enqueue`](super::BackendSession::enqueue) is asked to create.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct EnqueueRequest<'a> {
    /// The queue.
    pub queue: &'a QueueId,
    /// The entry's kind.
    pub kind: EntryKind,
    /// Identifies this acquisition attempt: a retry of the same attempt must find the entry an
    /// earlier try created instead of creating a second one.
    pub attempt: Uuid,
    /// The entry's value (an election candidate's published value; empty for locks).
    pub value: &'a [u8],
    /// Whether an earlier try of this attempt may have created the entry (its reply was lost
    /// or it failed in flight): look for it before creating.
    pub retry: bool,
    /// What the caller needs to know of the entries ahead: the `nearest` closest to the new
    /// entry (only those of `kind`, if given). Default: all of them. A backend may return more
    /// than asked; returning fewer than exist would be a bug (a grant too early).
    pub ahead: Ahead,
}

/// Which entries ahead an enqueue reports (see [`EnqueueRequest::ahead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ahead {
    /// Only entries of this kind (a reader needs only the writers ahead).
    pub kind: Option<EntryKind>,
    /// How many of the nearest.
    pub nearest: usize,
}

impl Ahead {
    /// Every entry ahead.
    pub const ALL: Ahead = Ahead {
        kind: None,
        nearest: usize::MAX,
    };
}

impl<'a> EnqueueRequest<'a> {
    /// A first try of `attempt`.
    pub fn new(queue: &'a QueueId, kind: EntryKind, attempt: Uuid, value: &'a [u8]) -> Self {
        EnqueueRequest {
            queue,
            kind,
            attempt,
            value,
            retry: false,
            ahead: Ahead::ALL,
        }
    }

    /// The same request, asking only for the `nearest` entries ahead (of `kind`, if given).
    pub fn with_ahead(mut self, kind: Option<EntryKind>, nearest: usize) -> Self {
        self.ahead = Ahead { kind, nearest };
        self
    }

    /// The same request, marked as a retry of an attempt that may have created its entry.
    pub fn retried(mut self) -> Self {
        self.retry = true;
        self
    }
}

/// What an enqueue created and learned, in the same round trip.
#[derive(Debug)]
#[non_exhaustive]
pub struct Enqueued {
    /// Our entry.
    pub entry: Entry,
    /// The entries ahead of ours that [`EnqueueRequest::ahead`] asked for (or more), in queue
    /// order (earliest first); empty when none is ahead.
    pub ahead: Vec<Peer>,
}

impl Enqueued {
    /// An enqueue result.
    pub fn new(entry: Entry, ahead: Vec<Peer>) -> Self {
        Enqueued { entry, ahead }
    }

    /// Whether our entry heads the queue.
    pub fn is_head(&self) -> bool {
        self.ahead.is_empty()
    }
}

/// What inspection knows of one entry of a queue (see
/// [`BackendSession::inspect`](super::BackendSession::inspect)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntryInfo {
    /// The full key or node path.
    pub key: String,
    /// Its fencing token (for the holder, the token its resource sees).
    pub token: crate::FencingToken,
    /// Exclusive (a mutex waiter, a writer, a candidate) or shared (a reader, a permit).
    pub kind: EntryKind,
    /// The session that owns it, as [`Session::id`](crate::Session::id) names sessions (etcd
    /// lease id, ZooKeeper session id, in hex).
    pub session: String,
    /// Its value (an election candidate's published value; empty for locks).
    pub value: Vec<u8>,
    /// When it was created, if the backend records it (ZooKeeper does; etcd does not).
    pub created: Option<std::time::SystemTime>,
}

impl EntryInfo {
    /// An entry's information.
    pub fn new(
        key: String,
        token: crate::FencingToken,
        kind: EntryKind,
        session: String,
        value: Vec<u8>,
        created: Option<std::time::SystemTime>,
    ) -> Self {
        EntryInfo {
            key,
            token,
            kind,
            session,
            value,
            created,
        }
    }
}

/// The value a revocation request writes into the holder's entry: Apache Curator's `Revoker`
/// writes the same, so Curator holders made revocable honour fencelock's requests and the
/// reverse.
pub const REVOKE_MARKER: &[u8] = b"__REVOKE__";

/// A session-level event pushed by a backend's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionEvent {
    /// The cluster reports the session expired (terminal).
    Expired,
    /// The connection to the cluster dropped; the session may still be alive.
    Disconnected,
    /// The connection came back and the session is still alive.
    Reconnected,
}
