//! Runnable examples of fencelock on real clusters: see the `*.rs` programs next to this
//! crate's `Cargo.toml` (`cargo run -p fencelock-examples --example leader -- --help`).
//! This library holds what they share: choosing a backend from the command line, and waiting
//! for a shutdown signal.

pub mod sql;

use std::sync::Arc;

use fencelock::backend::Backend;
use fencelock::MemoryBackend;

/// Where the example's cluster is: command-line options shared by the examples.
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArgs {
    /// etcd endpoints, comma-separated (`127.0.0.1:2379`).
    #[arg(long, conflicts_with_all = ["zookeeper", "redis"])]
    pub etcd: Option<String>,
    /// A ZooKeeper connect string (`127.0.0.1:2181[/chroot]`).
    #[arg(long, conflicts_with = "redis")]
    pub zookeeper: Option<String>,
    /// A Redis URL (`redis://127.0.0.1:6379`): efficiency locks, see `fencelock-redis`.
    #[arg(long)]
    pub redis: Option<String>,
}

impl BackendArgs {
    /// The backend the options name; the in-memory one (a demo inside this process) without.
    pub async fn connect(&self) -> fencelock::Result<(Arc<dyn Backend>, String)> {
        if let Some(eps) = &self.etcd {
            let endpoints: Vec<&str> = eps.split(',').collect();
            let b = fencelock_etcd::EtcdBackend::connect(&endpoints).await?;
            return Ok((Arc::new(b), format!("etcd at {eps}")));
        }
        if let Some(zk) = &self.zookeeper {
            let b = fencelock_zookeeper::ZooKeeperBackend::connect(zk).await?;
            return Ok((Arc::new(b), format!("ZooKeeper at {zk}")));
        }
        if let Some(url) = &self.redis {
            let b = fencelock_redis::RedisBackend::connect(url.as_str()).await?;
            return Ok((Arc::new(b), format!("Redis at {url}")));
        }
        Ok((
            Arc::new(MemoryBackend::new()),
            "the in-memory backend".into(),
        ))
    }

    /// Whether a real cluster was named.
    pub fn is_remote(&self) -> bool {
        self.etcd.is_some() || self.zookeeper.is_some() || self.redis.is_some()
    }
}

/// Resolves on ctrl-c (SIGINT) or SIGTERM, with the signal's name.
pub async fn shutdown_signal() -> &'static str {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}
