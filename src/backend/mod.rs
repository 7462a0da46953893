//! The implementer API: what a backend provides. **Users of fencelock never call these
//! methods**; they are for authors of backends (and the backends shipped with fencelock).
//! Nothing in the core knows etcd, ZooKeeper or Redis: a [`Session`](crate::Session) and every
//! lock primitive run on these traits alone.
//!
//! # The model
//!
//! A backend hands out *sessions* ([`Backend::open_session`]): an etcd lease, a ZooKeeper
//! session, a Redis key with a TTL. A session owns *entries* in ordered *queues*: one queue
//! per lock, election, read-write lock or semaphore ([`QueueId`]). In a lock or election queue
//! a session has at most one entry at a time (the core queues the tasks of one session
//! locally first), so its key may be derived from the session alone; in a read-write lock or a
//! semaphore it may have several (readers of one session read together, one session may hold
//! several permits), told apart by the [`EnqueueRequest::attempt`] that made each. An entry is
//! *ephemeral*: it goes when its session goes, all of a session's entries at once.
//!
//! The core runs every algorithm: the local queue, the wait loop (which entry ahead to wait
//! for, per the primitive's rule), retries, the heartbeat and the local deadline, and the
//! deferred cleanup of dropped guards. A backend only supplies the primitives below, each a
//! small number of round trips, and honours the contract stated on each.
//!
//! # What the interface is built for
//!
//! - **Entries of a kind** ([`EntryKind`]): readers and writers of a read-write lock share one
//!   order; a reader waits only on the nearest earlier writer.
//! - **The entries ahead of one's own** ([`Enqueued::ahead`]): an enqueue returns those the
//!   caller asks for ([`EnqueueRequest::ahead`]: all of them by default, or the nearest of a
//!   kind), in order, in the same round trip as the create. They can only leave, never be added, so
//!   the core walks this list instead of re-reading the queue: a handoff costs the same
//!   whatever the queue's length, and a semaphore with `n` permits can reason about the `n`
//!   entries ahead of a waiter.
//! - **Several queues in one atomic request** (an all-or-nothing multi-lock):
//!   [`BackendSession::enqueue_all`] creates entries in several queues in one etcd `Txn`, one
//!   ZooKeeper `multi` or one Redis script, or none of them.
//! - **Backends without ordered keys** (Redis): the order is whatever the backend defines
//!   ([`Entry::order`]: a sorted-set score), and waking a waiter is whatever it can do without
//!   polling (a notification per deleted entry).
//!
//! # Errors
//!
//! Every method returns [`crate::Error`]. Map client errors carefully, by the server's error
//! code rather than message text:
//! - **temporary** ([`crate::Error::is_temporary`]) only when the same call may succeed if
//!   retried unchanged: connection loss, leader change, timeouts. The core retries those with
//!   [`Backoff`], until the session is lost;
//! - [`crate::Error::SessionLost`] when the cluster says the session is gone (expired, closed);
//! - [`crate::Error::EntryVanished`] when one's own entry is found gone while waiting;
//! - everything else (bad input, size limits, authentication, authorization, configuration)
//!   permanent. A permanent error is returned to the caller at once: never retried. (One
//!   exception: a failed heartbeat, whatever its error, is tried again until the local
//!   deadline; the session is suspended meanwhile, and the deadline, not the error, ends it.)
//!
//! # Cancellation
//!
//! The core may drop any future of these methods at any await point. A backend must stay
//! consistent when that happens (no half-registered watch that misroutes later events, no lock
//! held across the cancel). The core never relies on a dropped call's side effects: a dropped
//! [`enqueue`](BackendSession::enqueue) is followed by an
//! [`abandon`](BackendSession::abandon) of its attempt.

//!
//! # Implementing a backend
//!
//! Two traits: [`Backend`] (settings and limits, and [`Backend::open_session`]) and
//! [`BackendSession`] (everything a session does). Of their 29 methods, 21 have no default.
//! The shipped backends keep one shape, one file per job, which a new backend can copy:
//!
//! | file | what |
//! |---|---|
//! | `config.rs`, `connect.rs` | settings, validation, connecting ([`Retry`] for the connect loop) |
//! | `lifecycle.rs` | open, keep alive, events, close |
//! | `session.rs` | the one `impl BackendSession`, one delegating line per method: a table of contents |
//! | `queue.rs` | enqueue, wait, still ahead, own gone, remove, abandon, set value |
//! | `read.rs` | head, queue change, inspect, list |
//! | `revoke.rs` | request and wait for a revocation |
//! | `watch.rs` | the backend's single watch primitive |
//! | `layout.rs` | pure key/path functions, with unit tests (key-value stores: [`key_value_entry_key`]) |
//! | `error.rs` | client errors mapped to [`Error`](crate::Error), temporary or not |
//!
//! The skeleton (each `todo!()` is one of the contracts stated on the method), and the proof:
//! run the behaviour suite (`fencelock::conformance`, feature `testing`) against a real
//! server.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use async_trait::async_trait;
//! use fencelock::backend::*;
//! use fencelock::{FencingToken, Result};
//! use uuid::Uuid;
//!
//! #[derive(Debug)]
//! struct MyBackend;
//!
//! #[async_trait]
//! impl Backend for MyBackend {
//!     fn name(&self) -> &'static str { "mine" }
//!     fn min_ttl(&self) -> Duration { Duration::from_secs(1) }
//!     async fn open_session(&self, ttl: Duration) -> Result<Arc<dyn BackendSession>> {
//!         Ok(Arc::new(MySession { ttl }))
//!     }
//! }
//!
//! #[derive(Debug)]
//! struct MySession { ttl: Duration }
//!
//! #[async_trait]
//! impl BackendSession for MySession {
//!     fn id(&self) -> String { todo!() }
//!     fn ttl(&self) -> Duration { self.ttl }
//!     async fn keep_alive(&self) -> Result<()> { todo!() }
//!     async fn close(&self) -> Result<()> { todo!() }
//!     async fn enqueue(&self, req: EnqueueRequest<'_>) -> Result<Enqueued> { todo!() }
//!     async fn enqueue_all(&self, reqs: &[EnqueueRequest<'_>]) -> Result<Option<Vec<Entry>>> { todo!() }
//!     async fn wait(&self, own: &Entry, target: &Peer) -> Result<()> { todo!() }
//!     async fn still_ahead(&self, own: &Entry, queue: &QueueId, kind: Option<EntryKind>, nearest: usize) -> Result<Vec<Peer>> { todo!() }
//!     async fn wait_own_gone(&self, own: &Entry) -> Result<()> { todo!() }
//!     async fn remove(&self, entry: &Entry) -> Result<bool> { todo!() }
//!     async fn abandon(&self, queue: &QueueId, kind: EntryKind, attempt: Uuid) -> Result<()> { todo!() }
//!     async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<bool> { todo!() }
//!     async fn head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> { todo!() }
//!     async fn wait_queue_change(&self, queue: &QueueId, seen: Option<&(Entry, Vec<u8>)>) -> Result<()> { todo!() }
//!     async fn inspect(&self, queue: &QueueId) -> Result<Vec<EntryInfo>> { todo!() }
//!     async fn list(&self, namespace: &str) -> Result<Vec<String>> { todo!() }
//!     async fn request_revoke(&self, key: &str, token: FencingToken) -> Result<bool> { todo!() }
//!     async fn wait_revoke(&self, own: &Entry) -> Result<()> { todo!() }
//! }
//! # let _ = MyBackend;
//! ```

mod key_value;
mod types;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

pub use types::{
    Ahead, EnqueueRequest, Enqueued, Entry, EntryInfo, EntryKind, Peer, QueueId, QueueKind,
    SessionEvent, REVOKE_MARKER,
};

pub use crate::retry::{Backoff, Retry};
pub use crate::session::clock::Deadline;
use crate::{LostReason, Result};
pub use key_value::{key_value_entry_key, key_value_queue_of};

/// The largest entry value (an election candidate's published value) accepted, in bytes:
/// 1,000,000, which fits a ZooKeeper packet under its default `jute.maxbuffer` (1 MiB), an
/// etcd request under its default `--max-request-bytes` (1.5 MiB), and a Redis argument. The
/// core refuses a longer value with [`Error::InvalidValue`](crate::Error::InvalidValue) before
/// any request.
pub const MAX_VALUE_LEN: usize = 1_000_000;

/// The most locks one multi-lock may take by default ([`Backend::max_multi_lock`]): 64, what fits
/// in one etcd transaction under etcd's default `--max-txn-ops` of 128 (two operations per
/// lock).
pub const DEFAULT_MAX_MULTI_LOCK: usize = 64;

/// A backend: a factory of sessions. Object safe; the core holds it as `Arc<dyn Backend>`.
///
/// # Validation
///
/// [`check_name`](Self::check_name), [`min_ttl`](Self::min_ttl), [`max_ttl`](Self::max_ttl)
/// and [`MAX_VALUE_LEN`] let the core refuse bad input with a typed error
/// at the earliest point (`session.mutex(name)`, `builder.start()`, `campaign(value)`),
/// instead of an untyped failure at the first request.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// A short tag used in errors and traces (`"etcd"`, `"zookeeper"`, `"redis"`, `"memory"`).
    fn name(&self) -> &'static str;

    /// The smallest TTL this backend accepts.
    fn min_ttl(&self) -> Duration;

    /// The largest TTL this backend accepts (default: one day). Larger requests are refused
    /// with [`Error::InvalidTtl`](crate::Error::InvalidTtl), never truncated or wrapped.
    fn max_ttl(&self) -> Duration {
        Duration::from_secs(24 * 3600)
    }

    /// The most locks one multi-lock may take: what [`BackendSession::enqueue_all`] can create
    /// in one atomic request (an etcd transaction's operation limit, a ZooKeeper packet, the
    /// time a Redis script may block the server). [`Session::multi_lock`](crate::Session::multi_lock)
    /// refuses larger sets with [`Error::InvalidConfig`](crate::Error::InvalidConfig). Default
    /// [`DEFAULT_MAX_MULTI_LOCK`].
    fn max_multi_lock(&self) -> usize {
        DEFAULT_MAX_MULTI_LOCK
    }

    /// Checks what this backend forbids in a lock or election name beyond the core's rules
    /// ([`crate::validate_name`]), for a queue in `namespace`. Fails with
    /// [`Error::InvalidName`](crate::Error::InvalidName). Default: nothing more.
    fn check_name(&self, namespace: &str, name: &str) -> Result<()> {
        let _ = (namespace, name);
        Ok(())
    }

    /// Whether the cluster counts time on Tokio's clock, as the session's timers do (default:
    /// no). Only the memory backend does: a session's local deadline is then measured on
    /// Tokio's clock alone (plus simulated suspends), so that a test on paused time
    /// (`start_paused`) rules it as it rules the cluster's expiry. Otherwise the deadline is
    /// also measured on a clock that counts while the machine is suspended.
    fn runs_on_tokio_clock(&self) -> bool {
        false
    }

    /// Whether a mutex and an election of one name are one queue (default: yes). On etcd they
    /// must be: Go's `concurrency` `Mutex` and `Election` both make the key `{prefix}/{lease}`,
    /// and the memory and Redis backends follow etcd. On ZooKeeper they are not: Curator's
    /// `InterProcessMutex` and `LeaderLatch` queue apart (`lock-` and `latch-` nodes). Every
    /// other pair of primitives of one name is independent on every backend. The core queues
    /// a session's mutex and election of one name locally as one when this holds.
    fn mutex_and_election_share_queue(&self) -> bool {
        true
    }

    /// The queue an entry key (as [`BackendSession::list`] returns it) belongs to: the queue's
    /// name relative to `namespace` and its kind; `None` for a key that is no entry. Used by
    /// [`Session::queues`](crate::Session::queues). Default: [`key_value_queue_of`], the layout
    /// of the etcd and memory backends.
    fn queue_of(&self, namespace: &str, key: &str) -> Option<(String, QueueKind)> {
        key_value_queue_of(namespace, key)
    }

    /// Checks a namespace beyond the core's rules ([`crate::validate_namespace`]). Default:
    /// nothing more.
    fn check_namespace(&self, namespace: &str) -> Result<()> {
        let _ = namespace;
        Ok(())
    }

    /// Creates a session with the requested TTL (already checked against
    /// [`min_ttl`](Self::min_ttl) and [`max_ttl`](Self::max_ttl)). The returned session reports
    /// the TTL actually granted or negotiated, which the core then enforces.
    async fn open_session(&self, ttl: Duration) -> Result<Arc<dyn BackendSession>>;
}

/// One session on the cluster. Every entry it creates is ephemeral: it goes when the session
/// goes.
///
/// # Lifecycle
///
/// [`keep_alive`](Self::keep_alive) is the one heartbeat: the core calls it every `ttl / 3` and
/// counts its local deadline from the instant it *sent* the last call that succeeded.
///
/// **Contract: a session must end (its entries go) when `keep_alive` has not been called for
/// one TTL**, exactly as a cluster expires an etcd lease. A backend whose client keeps the
/// session alive by itself (ZooKeeper's client pings on its own) must enforce this: the
/// ZooKeeper backend closes the session when `keep_alive` has not been called for one TTL.
/// Otherwise a process whose fencelock heartbeat stopped (a stuck runtime) would keep its
/// locks forever.
///
/// [`next_event`](Self::next_event) reports what the connection learns by itself (a
/// disconnect, the cluster's expiry), and [`close`](Self::close) ends the session on the
/// cluster.
///
/// # Entries
///
/// [`enqueue`](Self::enqueue) creates this session's entry in a queue and returns it with the
/// entries ahead of it. [`wait`](Self::wait) waits for one of those to go;
/// [`remove`](Self::remove) deletes one's own entry, guarded by its identity;
/// [`abandon`](Self::abandon) deletes whatever an attempt may have created;
/// [`set_value`](Self::set_value) changes an entry's value, guarded likewise;
/// [`wait_own_gone`](Self::wait_own_gone) watches one's own entry for deletion by others.
///
/// **Contract: a guarded operation never touches a newer entry.** Keys repeat (on etcd a session
/// that releases and queues again re-creates the same key): `remove`, `set_value` and
/// `wait` compare the entry's identity ([`Entry::order`] or token), never the key alone.
///
/// # Reading queues
///
/// [`head`](Self::head), [`wait_queue_change`](Self::wait_queue_change) and
/// [`list`](Self::list) serve elections' `leader()`/`observe()` and inspection.
#[async_trait]
pub trait BackendSession: Send + Sync + fmt::Debug + 'static {
    /// The session's id as the cluster knows it (lease id in hex, ZooKeeper session id in hex).
    fn id(&self) -> String;

    /// The TTL granted (etcd) or negotiated (ZooKeeper).
    fn ttl(&self) -> Duration;

    /// How often the core calls [`keep_alive`](Self::keep_alive) (default: a third of the
    /// TTL). A backend whose client pings by itself when idle may ask for a period that keeps
    /// those pings from ever being sent, so that the heartbeat replaces them instead of adding
    /// to them (ZooKeeper does). Must be at most a third of the TTL.
    fn heartbeat_interval(&self) -> Duration {
        self.ttl() / 3
    }

    /// Sends one heartbeat and waits for its confirmation. `Ok(())` means the cluster
    /// confirmed the session alive *after* the call started; the core counts its local
    /// deadline from the start of the call. [`Error::SessionLost`](crate::Error::SessionLost)
    /// means the cluster expired it; a temporary error means "unknown, try again".
    async fn keep_alive(&self) -> Result<()>;

    /// Waits for the next session-level event pushed by the cluster connection. Backends
    /// without such events never resolve (the default).
    async fn next_event(&self) -> SessionEvent {
        std::future::pending().await
    }

    /// Ends the session on the cluster: every entry it owns goes at once. Idempotent.
    async fn close(&self) -> Result<()>;

    /// Creates this session's entry as `req` asks, or finds it again when `req.retry` is set
    /// and an earlier try of the same attempt created it (the create-succeeded-but-reply-lost
    /// case). Returns the entry and the entries ahead of it that `req.ahead` asks for (at
    /// least those; every one by default), in as few round trips as the backend can (one on
    /// etcd and ZooKeeper).
    ///
    /// Must fail with a permanent error, having created nothing, for a value longer than
    /// [`MAX_VALUE_LEN`] (the core checks first; this is the backstop).
    async fn enqueue(&self, req: EnqueueRequest<'_>) -> Result<Enqueued>;

    /// Creates one entry in each of `reqs`' queues in **one atomic request**, each only if it
    /// would head its queue at once; else creates nothing and returns `None`. The all-or-nothing
    /// `try_lock` of a multi-lock. A retry of the same attempts must not create duplicates.
    async fn enqueue_all(&self, reqs: &[EnqueueRequest<'_>]) -> Result<Option<Vec<Entry>>>;

    /// Waits until `target` (an entry ahead of `own` from [`enqueue`](Self::enqueue)) is gone:
    /// deleted, expired, or replaced by a newer entry with its key. Returns at once if it is
    /// gone already. Must not miss a deletion that happens while the call is starting (watch
    /// first, then read). Fails with [`Error::EntryVanished`](crate::Error::EntryVanished) once
    /// it finds `own` gone (at its start, where it checks then, else at a later look: see
    /// below), so that a waiter whose entry was deleted does not wait on. Costs a constant
    /// number of requests whatever the queue's length.
    ///
    /// A backend may skip the read (and so the check of `own`) when it knows without a
    /// request that the target's deletion will be reported: etcd does, when a watch kept
    /// from an earlier wait on the same key already covers the target's whole life. The
    /// core confirms `own` at the next [`still_ahead`](Self::still_ahead), before any grant,
    /// as it must anyway for an entry deleted during the wait. A backend whose check of `own`
    /// is a request of its own may skip it at the start, and find `own` gone at its next
    /// periodic look instead (a third of the TTL, from 0.5 s to 5 s): the core calls `wait`
    /// right after an [`enqueue`](Self::enqueue) or a `still_ahead` that showed `own`, or
    /// again after a temporary error of the wait (a disconnect), each call's periodic look
    /// counted from its start. ZooKeeper does (the check was one request in six of a
    /// contended acquisition).
    async fn wait(&self, own: &Entry, target: &Peer) -> Result<()>;

    /// The entries still ahead of `own` in `queue` that its grant may depend on: of the
    /// entries created before `own` (only those of `kind`, if given), the `nearest` closest to
    /// it, in queue order. Fails with [`Error::EntryVanished`](crate::Error::EntryVanished) if
    /// `own` is gone.
    ///
    /// The core calls it each time an entry it waited for went, instead of walking the rest of
    /// the list [`enqueue`](Self::enqueue) returned (in a FIFO queue they went too, most
    /// often): one request per wake-up, which also confirms `own` before a grant. Its cost
    /// should depend on `nearest`, not on the queue's length, where the backend allows (an
    /// etcd range with a limit; ZooKeeper has to list the parent's children).
    ///
    /// A backend may answer without a request when the wait that just returned learnt, from
    /// the server, that `own` was live and headed its queue at or after the target's deletion
    /// (nothing can come ahead of an entry later): Redis does, when the release that woke the
    /// waiter names the live entry it left at the head. Such an answer is as fresh as a read
    /// sent when the wait returned; it must be used once, for the call that follows that wait.
    async fn still_ahead(
        &self,
        own: &Entry,
        queue: &QueueId,
        kind: Option<EntryKind>,
        nearest: usize,
    ) -> Result<Vec<Peer>>;

    /// Resolves once `own` no longer exists (deleted by someone else, expired, or replaced by
    /// a newer entry with the same key). Returns at once if it is already gone. Must not miss
    /// a deletion that happens while the call is starting. The core calls it only while a user
    /// awaits a guard's `lost()`: a held entry costs no watch otherwise. May fail with
    /// [`Error::SessionLost`](crate::Error::SessionLost) where the backend can tell that the
    /// session's end on the cluster is what deleted it (an etcd lease revoked or expired), so
    /// that `lost()` says so.
    async fn wait_own_gone(&self, own: &Entry) -> Result<()>;

    /// Resolves once `own`, a granted entry, holds its grant no more, with the reason: gone as
    /// [`wait_own_gone`](Self::wait_own_gone) says ([`LostReason::EntryDeleted`]), or found,
    /// after its server was replaced by a failover that may have lost writes, with `nearest`
    /// or more entries (of `kind`, if given) still ahead of it there: the grant rule's window,
    /// as [`still_ahead`](Self::still_ahead) takes it ([`LostReason::Superseded`]). The core
    /// calls it, as `wait_own_gone`, only while a user awaits a guard's `lost()`.
    ///
    /// Why: behind Redis Sentinel, a primary demoted by a failover takes writes until the
    /// sentinels reconfigure it (seconds); a session still there sees the others' sessions
    /// expire (they moved on) and is granted, then moves to the new primary, where its key is
    /// live and its entry behind theirs. Without a re-check the two holders overlapped until
    /// one let go (45 s in a black-box run). The default, for backends whose server is never
    /// replaced that way (etcd and ZooKeeper replicate before they answer), waits for `own`
    /// to go.
    async fn wait_grant_lost(
        &self,
        own: &Entry,
        queue: &QueueId,
        kind: Option<EntryKind>,
        nearest: usize,
    ) -> Result<LostReason> {
        let _ = (queue, kind, nearest);
        self.wait_own_gone(own)
            .await
            .map(|()| LostReason::EntryDeleted)
    }

    /// Deletes `entry` if it is still the same entry. Returns whether it deleted anything.
    /// A backend that knows why the entry is gone may fail with
    /// [`Error::NotHeld`](crate::Error::NotHeld) and that reason instead of `Ok(false)` (Redis
    /// behind Sentinel: [`LostReason::Superseded`] when a
    /// failover lost it). The release returns it as it is, even after a try of its own whose
    /// reply was lost (which `Ok(false)` would have it count as the removal): so only when the
    /// backend can tell the entry was lost otherwise (Redis: the server lacks its create). The removals of the background task and of a
    /// cancelled acquisition take it as done.
    async fn remove(&self, entry: &Entry) -> Result<bool>;

    /// Deletes whatever attempt `attempt` of this session created in `queue` as a `kind`
    /// entry, when the caller does not know whether the create happened (a cancelled or failed
    /// enqueue). Succeeds if there is nothing to delete.
    async fn abandon(&self, queue: &QueueId, kind: EntryKind, attempt: Uuid) -> Result<()>;

    /// Replaces the value of `entry` if it is still the same entry. Returns `false` if it is
    /// gone.
    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<bool>;

    /// The head of `queue` (its first entry of any kind) and its value, or `None` if the queue
    /// is empty.
    async fn head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>>;

    /// Resolves when `queue` changes relative to `seen` (the head and value last read by
    /// [`head`](Self::head)): the head is added, removed or replaced, or its value changes.
    /// Returns at once if the queue already differs from `seen`. It may also return without a
    /// change (a backend that reads again on a timer, where a change can go unannounced): the
    /// caller reads the head again and waits anew.
    async fn wait_queue_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()>;

    /// Every entry of `queue`, in queue order, with its token, owner, value and (where the
    /// backend records it) creation time: who holds and who waits, for inspection.
    async fn inspect(&self, queue: &QueueId) -> Result<Vec<EntryInfo>>;

    /// Lists the keys of every entry (of any session) under `namespace`, sorted. For
    /// inspection and for tests that prove no entry leaked.
    async fn list(&self, namespace: &str) -> Result<Vec<String>>;

    // Revocation.

    /// Asks the holder of the entry at `key` (still the entry with `token`) to let go, by
    /// writing [`REVOKE_MARKER`] as its value without changing its owner. Returns whether the
    /// entry was still there.
    async fn request_revoke(&self, key: &str, token: crate::FencingToken) -> Result<bool>;

    /// Resolves once the value of `own` is [`REVOKE_MARKER`] (at once if it is); fails with
    /// [`Error::EntryVanished`](crate::Error::EntryVanished) if `own` is gone.
    async fn wait_revoke(&self, own: &Entry) -> Result<()>;
}
