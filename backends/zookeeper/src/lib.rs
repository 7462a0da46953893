//! # fencelock-zookeeper
//!
//! The ZooKeeper backend of [fencelock]: correctness-grade locks and leader
//! election on the ZooKeeper ensemble you already run, with the holder's `czxid` as fencing
//! token.
//!
//! - **Session**: one ZooKeeper session per [`fencelock::Session`], requested with the
//!   session's TTL as timeout; the *negotiated* timeout becomes the TTL. `Disconnected` makes
//!   the session *suspended* (its local deadline keeps running); `Expired` makes it lost.
//! - **Layout** (Apache Curator compatible, so Java services using Curator's
//!   `InterProcessMutex` / `LeaderLatch` contend on the same locks): a lock `name` in
//!   namespace `ns` is the parent node `/ns/name`; each waiter is an ephemeral-sequential child
//!   `_c_{uuid}-lock-{seq}` (elections: `_c_{uuid}-latch-{seq}`), ordered by the sequence
//!   suffix. Parents are created as CONTAINER nodes (persistent on a server that refuses
//!   them as unimplemented).
//! - **Servers**: ZooKeeper 3.5 or later (every create is a `create2`, which 3.4 lacks); the
//!   tests run 3.8. With SASL, whether the session was authenticated is checked from 3.7 on
//!   (`whoami`); an older server is trusted to require it.
//! - **Fencing token**: the entry node's `czxid` (returned by the create itself), which grows
//!   with every new holder; never the sequence suffix, a 32-bit per-parent counter that
//!   restarts when the parent is re-created.
//! - **Lost create replies** are recovered as Curator's protected mode does: the uuid in the
//!   node name, plus a check that the node's ephemeral owner is our session.
//!
//! ```no_run
//! # async fn f() -> fencelock::Result<()> {
//! use std::time::Duration;
//! use fencelock::Session;
//! use fencelock_zookeeper::ZooKeeperBackend;
//!
//! let backend = ZooKeeperBackend::connect("127.0.0.1:2181").await?;
//! let session = Session::builder(backend).ttl(Duration::from_secs(10)).start().await?;
//! let guard = session.mutex("jobs/reindex")?.lock().await?;
//! println!("holding with token {}", guard.token()); // the node's czxid
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock::backend::{Backend, BackendSession, QueueKind};
use fencelock::Result;
use tracing::info_span;
use tracing::Instrument;

mod config;
mod connect;
mod error;
mod guarded;
mod layout;
mod lifecycle;
mod link;
mod nodes;
mod parents;
mod queue;
mod read;
mod revoke;
mod session;
mod watch;

pub use config::{
    AclMode, ZooKeeperConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MIN_TTL, MAX_CONNECT_TIMEOUT,
    MIN_CONNECT_TIMEOUT,
};
pub use fencelock_net::TlsConfig;
pub use guarded::add_ownership_check;

use config::Resolved;

/// The ZooKeeper backend: a factory of ZooKeeper sessions. Cheap to clone.
///
/// Made by [`ZooKeeperBackend::connect`] or [`ZooKeeperBackend::builder`]; pass it to
/// [`fencelock::Session::builder`].
#[derive(Debug, Clone)]
pub struct ZooKeeperBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: Resolved,
    /// Whether the servers support CONTAINER nodes (cleared on the first refusal).
    pub(crate) containers: AtomicBool,
    /// Queue parents known to exist (see [`parents::KnownParents`]).
    pub(crate) parents: parents::KnownParents,
}

impl ZooKeeperBackend {
    /// Connects with default settings to the cluster at `connect_string`
    /// (`host:port[,host:port...][/chroot]`); see [`ZooKeeperConfig::connect`] for what is
    /// checked and the errors.
    pub async fn connect(connect_string: &str) -> Result<Self> {
        ZooKeeperConfig::new(connect_string).connect().await
    }

    /// Starts configuring a backend for the cluster at `connect_string`: chroot, connect
    /// timeout, authentication, ACL.
    pub fn builder(connect_string: impl Into<String>) -> ZooKeeperConfig {
        ZooKeeperConfig::new(connect_string)
    }

    pub(crate) fn from_resolved(config: Resolved) -> Self {
        ZooKeeperBackend {
            inner: Arc::new(Inner {
                config,
                containers: AtomicBool::new(true),
                parents: parents::KnownParents::default(),
            }),
        }
    }

    /// The servers, each with its scheme (`tcp://`, or `tcp+tls://` with TLS), without the
    /// chroot.
    pub fn servers(&self) -> &str {
        &self.inner.config.servers
    }

    /// The chroot every path is relative to, if any.
    pub fn chroot(&self) -> Option<&str> {
        self.inner.config.chroot.as_deref()
    }
}

/// The most locks in one multi-lock on ZooKeeper (see [`Backend::max_multi_lock`]).
pub const MAX_MULTI_LOCK: usize = 128;

/// The largest session timeout a ZooKeeper client can ask for (the protocol carries it as
/// 32-bit milliseconds); servers cap it lower, at their `maxSessionTimeout`.
pub const MAX_TTL: Duration = Duration::from_millis(i32::MAX as u64);

#[async_trait]
impl Backend for ZooKeeperBackend {
    fn name(&self) -> &'static str {
        error::NAME
    }

    fn min_ttl(&self) -> Duration {
        self.inner.config.min_ttl
    }

    fn max_ttl(&self) -> Duration {
        MAX_TTL
    }

    /// 128: a multi-lock's `try_lock` is one `multi` of one create per lock, which must fit in
    /// one packet under the server's `jute.maxbuffer` (1 MiB by default) even with the longest
    /// names and namespace (about 1.1 KB a create), and is followed by a read of each queue.
    fn max_multi_lock(&self) -> usize {
        MAX_MULTI_LOCK
    }

    fn check_name(&self, namespace: &str, name: &str) -> Result<()> {
        layout::queue_path_of(namespace, name, self.inner.config.chroot.is_some()).map(drop)
    }

    /// Curator's `lock-` and `latch-` nodes queue apart, even under one parent.
    fn mutex_and_election_share_queue(&self) -> bool {
        false
    }

    fn queue_of(&self, namespace: &str, key: &str) -> Option<(String, QueueKind)> {
        let root = layout::namespace_root(namespace, self.inner.config.chroot.is_some()).ok()?;
        layout::queue_of(&root, key)
    }

    fn check_namespace(&self, namespace: &str) -> Result<()> {
        layout::namespace_root(namespace, self.inner.config.chroot.is_some()).map(drop)
    }

    async fn open_session(&self, ttl: Duration) -> Result<Arc<dyn BackendSession>> {
        let span = info_span!("zookeeper_session", requested = ?ttl);
        async {
            let (client, server) = self.inner.config.connect_client(ttl).await?;
            let session: Arc<dyn BackendSession> = Arc::new(lifecycle::ZkSession::new(
                self.inner.clone(),
                client,
                server,
                ttl,
            ));
            Ok(session)
        }
        .instrument(span)
        .await
    }
}
