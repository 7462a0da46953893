//! # fencelock-etcd
//!
//! The etcd backend of [fencelock]: a session is one etcd lease kept alive by one
//! keep-alive stream; a lock or election queue is a key prefix; an entry is the key
//! `{namespace}/{name}/{lease id in lowercase hex}` attached to the lease — the layout of etcd's
//! Go `clientv3/concurrency` `Mutex` and `Election`, so Go services and ours contend on the same
//! lock. The fencing token is the key's create revision.
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
mod error;
mod layout;
mod session;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, ConnectOptions};
use fencelock::backend::{Backend, BackendSession};
use fencelock::{Error, Result};

pub use config::EtcdConfig;
use error::NAME;

/// The etcd backend: a connected etcd client that opens lease-backed sessions. Cheap to clone.
#[derive(Clone)]
pub struct EtcdBackend {
    client: Client,
    config: Arc<EtcdConfig>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.config.endpoints)
            .finish()
    }
}

impl EtcdBackend {
    /// Connects to the etcd cluster at `endpoints` (`host:port` or URLs) with the default
    /// settings (a 5 s connect timeout). Fails with [`Error::Connect`] if no endpoint answers
    /// in time.
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(endpoints: S) -> Result<Self> {
        let endpoints = endpoints
            .as_ref()
            .iter()
            .map(|e| e.as_ref().to_string())
            .collect();
        Self::connect_with(EtcdConfig::new(endpoints)).await
    }

    /// Connects with explicit settings.
    pub async fn connect_with(config: EtcdConfig) -> Result<Self> {
        if config.endpoints.is_empty() {
            return Err(Error::invalid_config("", "no etcd endpoint given"));
        }
        let shown = config.endpoints.join(",");
        let fail = |source: fencelock::BoxError| Error::Connect {
            backend: NAME,
            endpoints: shown.clone(),
            temporary: true,
            source,
        };
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(config.keep_alive_interval, config.keep_alive_timeout)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user, password);
        }
        let connect = async {
            let mut client = Client::connect(&config.endpoints, Some(options))
                .await
                .map_err(|e| fail(e.into()))?;
            // Prove the cluster answers (the channel connects lazily).
            client
                .get("\0fencelock-probe", None)
                .await
                .map_err(|e| fail(e.into()))?;
            Ok::<_, Error>(client)
        };
        let client = tokio::time::timeout(config.connect_timeout, connect)
            .await
            .map_err(|_| fail(format!("no answer within {:?}", config.connect_timeout).into()))??;
        Ok(EtcdBackend {
            client,
            config: Arc::new(config),
        })
    }

    /// The underlying etcd client, for operations fencelock does not cover (such as guarded
    /// writes of your own that compare the lock key's create revision).
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// The smallest lease TTL etcd grants with its default election timeout (it silently raises
/// smaller requests).
pub const MIN_TTL: Duration = Duration::from_secs(2);

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

    async fn open_session(&self, ttl: Duration) -> Result<Arc<dyn BackendSession>> {
        Ok(Arc::new(
            session::EtcdSession::open(self.client.clone(), ttl).await?,
        ))
    }
}
