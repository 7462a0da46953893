//! # fencelock-etcd
//!
//! The etcd backend of [fencelock]: a session is one etcd lease kept alive by one
//! keep-alive stream; a lock or election queue is a key prefix; an entry is the key
//! `{namespace}/{name}/{lease id in lowercase hex}` attached to the lease — the layout of etcd's
//! Go `clientv3/concurrency` `Mutex` and `Election`, so Go services and ours contend on the same
//! lock. The fencing token is the key's create revision. A session may also keep one *fence*
//! key, `{namespace}/./{lease id in hex}`: a create the cluster applies after the session gave
//! it up fails against it instead of leaving an entry that nobody holds.
//!
//! ```no_run
//! # async fn run() -> fencelock::Result<()> {
//! use std::time::Duration;
//! use fencelock::Session;
//! use fencelock_etcd::EtcdBackend;
//!
//! let backend = EtcdBackend::connect(["127.0.0.1:2379"]).await?;
//! let session = Session::builder(backend).ttl(Duration::from_secs(10)).start().await?;
//! let guard = session.mutex("jobs/reindex")?.lock().await?;
//! println!("token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod config;
mod connect;
mod error;
mod fence;
mod guarded;
mod layout;
mod lifecycle;
mod queue;
mod read;
mod request;
mod revoke;
mod rotation;
mod session;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::Client;
use fencelock::backend::{Backend, BackendSession};
use fencelock::Result;

pub use config::{EtcdConfig, MAX_SETTING, MIN_SETTING};
use error::NAME;
pub use fencelock_net::TlsConfig;
pub use guarded::{guarded_txn, ownership};

/// The etcd backend: a connected etcd client that opens lease-backed sessions. Cheap to clone.
#[derive(Clone)]
pub struct EtcdBackend {
    client: Arc<Client>,
    config: Arc<EtcdConfig>,
    /// The endpoints in the client's rotation, kept by the monitor and the sessions' streams.
    rotation: Arc<rotation::Rotation>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.config.endpoints)
            .finish()
    }
}

impl EtcdBackend {
    /// Connects to the etcd cluster at `endpoints` (`host:port` or `http://host:port`) with
    /// the default settings (see [`EtcdConfig`]).
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(endpoints: S) -> Result<Self> {
        Self::connect_with(EtcdConfig::new(endpoints.as_ref())).await
    }

    /// Connects with explicit settings (TLS, user, timeouts).
    ///
    /// Each endpoint is checked on its own first, and the client uses only those that answer
    /// (the others are added back once they do), so a cluster with a member down connects and
    /// serves reliably. Afterwards every endpoint is checked twice a second: a member that
    /// misses two checks in a row (down, or hung) is taken out of the rotation until it answers
    /// again; so is, at once, a member on which a session's keep-alive or watch stream went
    /// silent (the stream is then opened again on another member). Fails, within the connect
    /// timeout (and, with a user, its authentication within the request timeout; a failed
    /// connect's probes of each endpoint may take a moment more), with:
    /// - [`Error::InvalidConfig`](fencelock::Error::InvalidConfig) for bad settings (no
    ///   endpoint, a malformed one, `https://` without TLS, a user when the cluster has no
    ///   authentication, a plaintext client at a TLS port or the reverse);
    /// - [`Error::Unauthenticated`](fencelock::Error::Unauthenticated) for a wrong user or
    ///   password, or a client certificate the servers reject;
    /// - [`Error::Connect`](fencelock::Error::Connect) when no endpoint answers: temporary if
    ///   they refuse or time out, permanent if no name resolves or the servers' certificates
    ///   are not trusted. Its source says, per endpoint, why.
    pub async fn connect_with(config: EtcdConfig) -> Result<Self> {
        let (client, rotation) = connect::connect(&config).await?;
        let client = Arc::new(client);
        let rotation = Arc::new(rotation);
        tokio::spawn(connect::monitor(
            Arc::downgrade(&client),
            config.clone(),
            rotation.clone(),
        ));
        Ok(EtcdBackend {
            client,
            config: Arc::new(config),
            rotation,
        })
    }

    /// The underlying etcd client, for operations fencelock does not cover (such as guarded
    /// writes of your own that compare the lock key's create revision). Exposed on purpose:
    /// it is the client the sessions use, with their authentication and TLS.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// The smallest lease TTL etcd grants with its default election timeout (it silently raises
/// smaller requests).
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// The most locks in one multi-lock on etcd (see [`Backend::max_multi_lock`]): half of etcd's
/// default `--max-txn-ops` (128), as its one transaction takes two operations per lock.
pub const MAX_MULTI_LOCK: usize = 64;

/// The largest lease TTL etcd grants (its `MaxLeaseTTL`, 9,000,000,000 s).
pub const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

#[async_trait]
impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn min_ttl(&self) -> Duration {
        MIN_TTL
    }

    fn max_ttl(&self) -> Duration {
        MAX_TTL
    }

    /// 64: a multi-lock's `try_lock` is one transaction of two operations per lock (a put and
    /// a read of its create revision), and etcd refuses a transaction of more than
    /// `--max-txn-ops` operations, 128 by default ("too many operations in txn request").
    fn max_multi_lock(&self) -> usize {
        MAX_MULTI_LOCK
    }

    async fn open_session(&self, ttl: Duration) -> Result<Arc<dyn BackendSession>> {
        Ok(Arc::new(
            lifecycle::EtcdSession::open(Client::clone(&self.client), self.rotation.clone(), ttl)
                .await?,
        ))
    }
}
