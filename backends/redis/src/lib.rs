//! # fencelock-redis
//!
//! The Redis backend of [fencelock], for **efficiency locks** (avoid duplicate work: a rare
//! double grant wastes effort, never corrupts data), with the same `Session`, `Mutex`,
//! `Election`, `RwLock`, `Semaphore` and `MultiLock` API as etcd and ZooKeeper: moving to etcd
//! later is a one-line change (primitives of one name behave as on etcd: a mutex and an
//! election of one name are one queue, every other pair is independent; see the README's "One
//! name, several primitives"). Also [`Redlock`], over several independent Redis servers.
//!
//! ```no_run
//! # async fn run() -> fencelock::Result<()> {
//! use std::time::Duration;
//! use fencelock::Session;
//! use fencelock_redis::RedisBackend;
//!
//! let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
//! let session = Session::builder(backend).ttl(Duration::from_secs(10)).start().await?;
//! let guard = session.mutex("jobs/reindex")?.lock().await?;
//! println!("token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How the lock maps onto Redis
//!
//! - **One session per process**: a key `fencelock:s:{id}` with a `PX` TTL, renewed by the
//!   session's one heartbeat (one script call every TTL/3, which also extends the TTL of the
//!   entries the session owns: one request whatever the number of locks held, server work
//!   proportional to it). The local deadline is the etcd one: the send time of the last
//!   confirmed heartbeat + TTL − margin.
//! - **An ordered FIFO queue per lock**: a sorted set scored by the entry's fencing token.
//! - **Waiters woken without polling and without a herd**: a release names the entry right
//!   behind the one deleted on that entry's session's own pub/sub channel
//!   (`fencelock:w:{sid}`, which the session listens on from its first wait; that first wait
//!   also subscribes to the channel of the entry ahead of it): one waiter woken per release. A waiter also re-checks when the session of the
//!   entry it waits for would expire (that session's remaining TTL, read with the entry): one
//!   check per TTL of the holder, whatever the queue's length.
//! - **Entries of dead sessions** (whose session key expired) are removed by whoever reads
//!   them: a waiter behind them, an enqueue, `leader()`, inspection. What no one reads expires
//!   by itself: the session's key a TTL after its last heartbeat, its entries' hashes and
//!   queues 60 TTLs after their last renewal (a queue once no live session renews it). Those
//!   expiries only clear leftovers (an entry is live while its session's key is, and on a
//!   cluster lists it), so they are
//!   long: a heartbeat renews the session's key and, 256 entries at most or else a twentieth
//!   of them at least, going on where the last beat stopped, its entries' expiries. One that
//!   renewed every entry each time blocked the server for 0.88–0.98 s (median) at 100,000
//!   held locks; a twentieth takes 76–87 ms (the `redis_heartbeat` example of
//!   `fencelock-bench`, side by side).
//! - **Every change is one Lua script** (create + read the entries ahead, release as a
//!   compare-and-delete on the token, proclaim, revoke, close): a crash between steps leaves
//!   nothing half-made.
//!
//! The key layout is in [`layout`]. A single Redis server (with or without replicas), over
//! TLS if asked, or a primary managed by **Sentinel**: `redis+sentinel://s1:26379,s2:26379/
//! MASTER` asks the sentinels where the primary is, and asks again when a request fails the
//! way a failover makes it fail (and once a second, at heartbeats); see [`RedisConfig::new`].
//!
//! **Redis Cluster**: `redis+cluster://n1:6379,n2:6379,…` (`rediss+cluster://` for TLS). The
//! queues are spread over the shards by a hash of their path into [`layout::GROUPS`] groups,
//! each a hash tag: a queue, its entries, its token counter and its sessions' keys are in one
//! slot, so every operation is still one script on one node. A session has a key in each
//! group where it holds or waits for something, and its heartbeat is one script per such
//! group (at most [`layout::GROUPS`], whatever the number of locks): it depends on the shards
//! of its locks alone. Fencing tokens grow per lock (one
//! counter per group), not across groups. A multi-lock's `try_lock` is one atomic script when
//! all its locks share a group; across groups it takes them group by group and releases what
//! it took if a later group is taken. Redirections (`MOVED`, `ASK`) are followed; while a slot
//! migrates, a script that meets a key not (or no longer) on the node stops with `TRYAGAIN`
//! before reading it (each key is touched together with the group's counter first), and is
//! retried until the move ends: a half-moved queue is never read. `PUBLISH` reaches every
//! node: a session subscribes on one node of the URL (the next one if it fails). Run the
//! nodes with `cluster-require-full-coverage no`: by default the whole cluster refuses
//! requests while any shard has no primary, suspending every session during each failover.
//! `wait_for_replicas` is refused on a cluster (its replication is asynchronous: a failover of
//! a shard can lose its last grants, as after an asynchronous failover above).
//!
//! Expiry is the Redis server's: it expires a session key by its own wall clock, so a server
//! clock that jumps forward expires sessions early (a double grant, which fencing catches);
//! etcd and ZooKeeper count leases and sessions on the leader's monotonic clock.
//!
//! An operator who deletes an entry by hand must do what the `remove` script does: delete the
//! entry's hash and its sorted-set member, `PUBLISH fencelock:c:{entry} gone` (its owner's
//! `lost()` fires), and, for the entry `next` now right behind it (token `t`, session `sid`),
//! `PUBLISH fencelock:w:{sid} "{next} {t} head"` (`ahead` instead of `head` if the deleted
//! entry was not the queue's head; the scripts say `expired` instead of `head` when they drop
//! an entry whose session expired), and, if it headed the queue `{path}`, `PUBLISH
//! fencelock:h:{path} gone` for its observers. Without those messages, the waiter behind it
//! and the queue's observers only notice when the deleted entry's session would expire, up to
//! a TTL later.
//!
//! # Fencing tokens, and when they are monotonic
//!
//! The token is one counter (`fencelock:t`) for every namespace — two namespaces can name the
//! same queue (`/svc` + `x`, and the empty namespace + `svc/x`), whose order must be one —
//! (on a cluster, one per group: a lock's tokens grow, and those of the locks of its group)
//! incremented in the same script that creates the entry, so every later grant gets a larger
//! token —
//! **as long as the server never loses an acknowledged write**:
//!
//! - a single server with `appendonly yes` and `appendfsync always` keeps its counter across
//!   crashes and restarts (with `appendfsync everysec`, up to a second of writes, counter
//!   increments included, can be lost in a crash: a later token can repeat an earlier one);
//! - with replicas, only if a promoted replica had every write: set
//!   [`RedisConfig::wait_for_replicas`] and promote only replicas that acknowledged.
//!
//! **Asynchronous failover breaks both the exclusion and the tokens**: a replica promoted
//! before it received the last writes does not have the holder's entry (a second client is
//! granted the lock while the first still holds it) nor the last counter increments (the
//! second client's token can be *smaller* than the first's, so a resource that checks tokens
//! refuses the new holder and accepts the old one until a larger token arrives). The adversity
//! tests show both. If that matters, use etcd or ZooKeeper.
//!
//! A failover can also bring back an entry whose release it lost, owned by a session that is
//! still alive. Each session follows a version of what it owns (bumped by every create and
//! release, returned with every reply); when the server's version goes back, the session's next
//! heartbeat deletes the entries it does not own any more, so the lock is not blocked for the
//! rest of that session's life.
//!
//! # Redlock
//!
//! [`Redlock`] takes a lock on a majority of N independent servers (no replication between
//! them), as the Redis documentation describes, with a fencing token that *is* monotonic while
//! no server loses acknowledged writes (see its docs for what it relies on).
#![forbid(unsafe_code)]

mod cluster;
mod con;
mod config;
mod connect;
mod error;
mod expired;
mod guarded;
mod heartbeat;
mod held;
mod hosts;
pub mod layout;
mod lifecycle;
mod own_channel;
mod owned;
mod primary;
mod queue;
mod read;
mod redlock;
mod redlock_timing;
mod replicas;
mod reply;
mod revoke;
mod scripts;
mod sentinel;
mod session;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock::backend::{Backend, BackendSession};
use fencelock::{Error, Result};

pub use con::RedisConnection;
pub use config::{RedisConfig, DEFAULT_TIMEOUT, MAX_REPLICAS, MAX_TIMEOUT, MIN_TIMEOUT};
pub use fencelock_net::TlsConfig;
pub use guarded::guarded_set;
pub use redlock::{Redlock, RedlockGuard};
pub use redlock_timing::{RedlockTiming, MAX_LOCK_TTL, MAX_RETRY_DELAY, MIN_LOCK_TTL};

use error::NAME;

/// The most locks in one multi-lock on Redis (see [`Backend::max_multi_lock`]).
pub const MAX_MULTI_LOCK: usize = 256;

/// The smallest session TTL accepted (1 s).
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// The Redis backend: one multiplexed connection (re-established after a failure; on a
/// cluster, one per node) shared by its sessions; each session adds a pub/sub connection from
/// its first wait until it is closed or dropped. Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    primary: Arc<primary::Primary>,
    config: Arc<RedisConfig>,
    /// The server's `maxmemory-policy` at connect, if it may evict keys.
    evicting: Option<Arc<str>>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("config", &self.config)
            .finish()
    }
}

impl RedisBackend {
    /// Connects to the Redis server at `url` with the default settings (see [`RedisConfig`]).
    pub async fn connect(url: impl Into<String>) -> Result<Self> {
        Self::connect_with(RedisConfig::new(url)).await
    }

    /// Connects with explicit settings. Fails, within about twice the timeout (the connect,
    /// then the check that the server is no cluster node; behind Sentinel, see
    /// [`RedisConfig`]), with
    /// [`Error::InvalidConfig`] for a bad URL or setting, [`Error::Unauthenticated`] for a
    /// wrong user or password, [`Error::Connect`] (temporary) when the server does not answer.
    pub async fn connect_with(config: RedisConfig) -> Result<Self> {
        let target = config.validate()?;
        let config = Arc::new(config);
        let primary = primary::Primary::connect(config.clone(), target).await?;
        let evicting = connect::warn_if_evicting(primary.con())
            .await
            .map(Arc::from);
        Ok(RedisBackend {
            primary,
            config,
            evicting,
        })
    }

    /// The server's `maxmemory-policy` found at connect, if it may evict keys (any policy but
    /// `noeviction`; `None` too where `CONFIG GET` is refused). Under it, an evicted entry,
    /// queue or session frees its lock at once, and an evicted token counter restarts the
    /// fencing tokens: the connect warns of it (a `tracing` warning), and so can a program
    /// that shows no logs (the `fencelock` command says it).
    pub fn eviction_policy(&self) -> Option<&str> {
        self.evicting.as_deref()
    }

    /// The connection the sessions use, for operations fencelock does not cover (such as a
    /// resource of your own in Redis that checks fencing tokens). Behind Sentinel, the
    /// connection to the primary of the moment: after a failover, call this again. On a
    /// cluster, requests go to the node that serves their first key; after a node hung, the
    /// sessions' connection is made again (see the README), so call this again then too.
    pub fn connection(&self) -> RedisConnection {
        self.primary.con()
    }

    /// `key` where [`guarded_set`] can check `grant` with it: on a Redis Cluster, in the slot
    /// of the grant's entry (the entry's hash tag, `{G}`, before the key, unless its first
    /// hash tag is that already); on one server or behind Sentinel, `key` as it is. Code that
    /// builds its guarded keys with this runs unchanged on every deployment.
    ///
    /// ```no_run
    /// # async fn run(session: fencelock::Session, backend: fencelock_redis::RedisBackend) -> fencelock::Result<()> {
    /// let guard = session.mutex("config/publisher")?.lock().await?;
    /// let key = backend.colocated_key(&guard, "config/current");
    /// let written = fencelock_redis::guarded_set(&mut backend.connection(), &guard, &key, b"v42").await?;
    /// # Ok(()) }
    /// ```
    pub fn colocated_key(&self, grant: &impl fencelock::Holding, key: &str) -> String {
        match self.primary.groups() {
            layout::Groups::Cluster => guarded::colocated(grant.key(), key),
            layout::Groups::Single => key.to_string(),
        }
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn min_ttl(&self) -> Duration {
        MIN_TTL
    }

    /// 256: a multi-lock's `try_lock` is one Lua script, which blocks the server while it
    /// runs; the bound keeps it short.
    fn max_multi_lock(&self) -> usize {
        MAX_MULTI_LOCK
    }

    async fn open_session(&self, ttl: Duration) -> Result<Arc<dyn BackendSession>> {
        // Each heartbeat then waits for the replicas: that wait must fit in the third of the
        // TTL a heartbeat has to be confirmed.
        if let Some((_, wait)) = self.config.replicas {
            if wait.saturating_mul(3) >= ttl {
                return Err(Error::invalid_ttl(
                    ttl,
                    format!("with wait_for_replicas(_, {wait:?}), the TTL must exceed three times that wait"),
                ));
            }
        }
        // Acknowledged calls on connections of the session's own: a `WAIT` blocks its
        // connection, and the heartbeats of sessions sharing one waited one behind another.
        let acked = self.config.replicas.map(|(n, wait)| {
            Arc::new(replicas::Acks::new(
                self.primary.clone(),
                self.config.timeout,
                n,
                wait,
            ))
        });
        Ok(Arc::new(
            lifecycle::RedisSession::open(self.primary.clone(), self.config.clone(), acked, ttl)
                .await?,
        ))
    }
}
