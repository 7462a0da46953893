//! Which backend a test runs against, and where: opening backends and sessions on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::backend::Backend;
use fencelock::Session;

/// A backend kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// etcd (endpoints `host:port,...`).
    Etcd,
    /// ZooKeeper (connect string `host:port,...`).
    ZooKeeper,
    /// Redis (one `host:port`: the primary, or an address that follows it; or a
    /// `redis+sentinel://` URL).
    Redis,
}

impl Kind {
    /// The name used on command lines (`etcd`, `zookeeper`).
    pub fn arg(self) -> &'static str {
        match self {
            Kind::Etcd => "etcd",
            Kind::ZooKeeper => "zookeeper",
            Kind::Redis => "redis",
        }
    }

    /// The kind named `arg` on a command line.
    pub fn parse(arg: &str) -> Option<Kind> {
        match arg {
            "etcd" => Some(Kind::Etcd),
            "zookeeper" => Some(Kind::ZooKeeper),
            "redis" => Some(Kind::Redis),
            _ => None,
        }
    }
}

/// A backend kind and the cluster's client addresses.
#[derive(Debug, Clone)]
pub struct Target {
    /// Which backend.
    pub kind: Kind,
    /// Every member's client address, comma-separated.
    pub endpoint: String,
}

/// How long a grant or heartbeat behind Sentinel waits for a replica's acknowledgement.
pub const SENTINEL_REPLICA_WAIT: Duration = Duration::from_millis(500);

/// How long a harness keeps trying to connect while a cluster elects a leader.
const CONNECT_PATIENCE: Duration = Duration::from_secs(30);

impl Target {
    /// A target.
    pub fn new(kind: Kind, endpoint: impl Into<String>) -> Self {
        Target {
            kind,
            endpoint: endpoint.into(),
        }
    }

    /// Connects a backend to `addr` (the cluster, or a proxy in front of it) once, bounded by
    /// the backend's connect timeout.
    pub async fn try_backend_at(&self, addr: &str) -> fencelock::Result<Arc<dyn Backend>> {
        Ok(match self.kind {
            Kind::Etcd => Arc::new(
                fencelock_etcd::EtcdBackend::connect(addr.split(',').collect::<Vec<_>>()).await?,
            ),
            Kind::ZooKeeper => {
                Arc::new(fencelock_zookeeper::ZooKeeperBackend::connect(addr).await?)
            }
            // Behind Sentinel, grants and heartbeats wait for replicas (`URL#acks=N`, N
            // replicas; 1 without it): what the design asks of a Redis lock that must survive a
            // failover (the suite's Sentinel rows).
            Kind::Redis if addr.starts_with("redis+sentinel://") => {
                let (url, acks) = match addr.split_once("#acks=") {
                    Some((url, n)) => (url, n.parse().unwrap_or(1)),
                    None => (addr, 1),
                };
                Arc::new(
                    fencelock_redis::RedisConfig::new(url)
                        .wait_for_replicas(acks, SENTINEL_REPLICA_WAIT)
                        .connect()
                        .await?,
                )
            }
            Kind::Redis => Arc::new(fencelock_redis::RedisBackend::connect(addr).await?),
        })
    }

    /// Connects a backend to `addr`, retrying (bounded) while the cluster elects a leader;
    /// panics if it cannot.
    pub async fn backend_at(&self, addr: &str) -> Arc<dyn Backend> {
        let start = Instant::now();
        loop {
            match self.try_backend_at(addr).await {
                Ok(b) => return b,
                Err(e) if start.elapsed() < CONNECT_PATIENCE => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot connect to {:?} at {addr}: {e:?}", self.kind),
            }
        }
    }

    /// Opens a session on `addr` in `namespace`.
    pub async fn session_at(&self, addr: &str, namespace: &str, ttl: Duration) -> Session {
        Session::builder(self.backend_at(addr).await)
            .namespace(namespace)
            .ttl(ttl)
            .start()
            .await
            .expect("session")
    }

    /// Opens a session on the cluster in `namespace`.
    pub async fn session(&self, namespace: &str, ttl: Duration) -> Session {
        self.session_at(&self.endpoint, namespace, ttl).await
    }
}
