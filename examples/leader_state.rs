//! A leader publishing state into the store itself, guarded by the store: every write carries a
//! check that this candidate still leads (etcd: a transaction comparing its key's create
//! revision, Go's `IsOwner()`; ZooKeeper: a `multi` checking its candidate node). A leader that
//! was paused past its TTL and wakes up still writing is refused by etcd or ZooKeeper, even
//! before it learns that it lost.
//!
//! ```text
//! cargo run -p fencelock-examples --example leader_state -- --etcd 127.0.0.1:2379 --name node-a
//! cargo run -p fencelock-examples --example leader_state -- --zookeeper 127.0.0.1:2181 --name node-b
//! cargo run -p fencelock-examples --example leader_state -- --redis redis://127.0.0.1:6379 --name node-c
//! ```
//!
//! The state lives at `{namespace}/state/{election}` (etcd key, Redis key; Redis checks the
//! leadership in a script, `fencelock_redis::guarded_set`; on a Redis Cluster the key is
//! prefixed with the election's hash tag, `{G}`, to be in its slot) or
//! `/{namespace}-state/{election}` (ZooKeeper node). Each tick the leader writes
//! `{name} epoch {epoch} #{n}` and prints `PUBLISHED …`, or `REFUSED …` when the store refuses
//! (then it campaigns again). Without a cluster it prints what it would do and exits.

use std::time::Duration;

use clap::Parser;
use fencelock::{Leadership, Session};
use fencelock_examples::{shutdown_signal, BackendArgs};
use zookeeper_client as zk;

#[derive(Parser, Debug)]
#[command(about = "A leader publishing state into etcd, ZooKeeper or Redis, guarded by the store")]
struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// This instance's name.
    #[arg(long, default_value = "node-a")]
    name: String,
    /// The election.
    #[arg(long, default_value = "publisher")]
    election: String,
    /// How often the leader publishes.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    every: Duration,
    /// The namespace.
    #[arg(long, default_value = fencelock::DEFAULT_NAMESPACE)]
    namespace: String,
    /// The session's TTL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ttl: Duration,
}

/// Where the state goes, written only under a check of the leadership.
enum Store {
    Etcd(Box<etcd_client::Client>, String),
    ZooKeeper(zk::Client, String),
    Redis(fencelock_redis::RedisBackend, String),
}

impl Store {
    async fn open(args: &Args) -> Result<Store, Box<dyn std::error::Error>> {
        if let Some(eps) = &args.backend.etcd {
            let client =
                etcd_client::Client::connect(eps.split(',').collect::<Vec<_>>(), None).await?;
            let key = format!("{}/state/{}", args.namespace, args.election);
            return Ok(Store::Etcd(Box::new(client), key));
        }
        if let Some(url) = &args.backend.redis {
            let backend = fencelock_redis::RedisBackend::connect(url.as_str()).await?;
            let key = format!("{}/state/{}", args.namespace, args.election);
            return Ok(Store::Redis(backend, key));
        }
        let servers = args.backend.zookeeper.as_deref().unwrap_or_default();
        let client = zk::Client::connect(servers).await?;
        let path = format!(
            "/{}-state/{}",
            args.namespace.trim_matches('/').replace('/', "-"),
            args.election
        );
        let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        if let Some((parent, _)) = path.rsplit_once('/') {
            client.mkdir(parent, &open).await?;
        }
        match client.create(&path, b"", &open).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Store::ZooKeeper(client, path))
    }

    /// Writes `value` if `leader` still leads, atomically: whether the store applied it.
    async fn publish(
        &self,
        leader: &Leadership,
        value: &str,
    ) -> Result<bool, Box<dyn std::error::Error>> {
        match self {
            Store::Etcd(client, key) => {
                let txn = fencelock_etcd::guarded_txn(leader).and_then([etcd_client::TxnOp::put(
                    key.as_str(),
                    value,
                    None,
                )]);
                Ok(client.kv_client().txn(txn).await?.succeeded())
            }
            Store::ZooKeeper(client, path) => {
                let mut multi = client.new_multi_writer();
                fencelock_zookeeper::add_ownership_check(&mut multi, leader)?;
                multi.add_set_data(path, value.as_bytes(), None)?;
                match multi.commit().await {
                    Ok(_) => Ok(true),
                    Err(zk::MultiWriteError::OperationFailed { index: 0, .. }) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Store::Redis(backend, key) => {
                // On a Redis Cluster, in the slot of the leadership's entry (the key as it
                // is on one server).
                let key = backend.colocated_key(leader, key);
                let mut con = backend.connection();
                Ok(fencelock_redis::guarded_set(&mut con, leader, &key, value.as_bytes()).await?)
            }
        }
    }
}

/// Leads and publishes until the store refuses or the leadership is lost; campaigns again.
async fn serve(
    session: &Session,
    store: &mut Store,
    args: &Args,
) -> Result<(), Box<dyn std::error::Error>> {
    let election = session.election(&args.election)?;
    loop {
        let leader = election.campaign(args.name.as_bytes()).await?;
        let epoch = leader.epoch();
        println!("{}: leading, epoch {epoch}", args.name);
        let mut tick = tokio::time::interval(args.every);
        let lost = leader.lost();
        tokio::pin!(lost);
        let mut n = 0u64;
        loop {
            tokio::select! {
                // Ticks first: a leader resumed from a pause writes before it notices, as a
                // real one might; the store is what refuses it.
                biased;
                _ = tick.tick() => {
                    n += 1;
                    let value = format!("{} epoch {epoch} #{n}", args.name);
                    // The error as text: a boxed error is not `Send`, and the arm awaits.
                    let published = store.publish(&leader, &value).await.map_err(|e| e.to_string());
                    match published {
                        Ok(true) => println!("PUBLISHED {value}"),
                        Ok(false) => {
                            println!("REFUSED {value}: not the leader any more");
                            break;
                        }
                        // The store's own connection failed (say it timed out while this
                        // process was paused): still the leader as far as it knows, so it
                        // writes again at the next tick, through a new connection.
                        Err(e) => {
                            println!("{}: the store failed ({e}); reconnecting", args.name);
                            *store = Store::open(args).await?;
                        }
                    }
                }
                reason = &mut lost => {
                    println!("{}: leadership lost ({reason})", args.name);
                    break;
                }
            }
        }
        let _ = leader.resign().await;
        if let fencelock::SessionState::Lost(end) = session.state() {
            return Err(Box::new(fencelock::Error::SessionLost(end)));
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if !args.backend.is_remote() {
        println!(
            "pass --etcd HOST:PORT, --zookeeper HOST:PORT or --redis URL: the state is written into the store"
        );
        return Ok(());
    }
    let (backend, what) = args.backend.connect().await?;
    let mut store = Store::open(&args).await?;
    println!(
        "{}: campaigning for {:?} on {what}",
        args.name, args.election
    );
    loop {
        let session = Session::builder(backend.clone())
            .namespace(args.namespace.as_str())
            .ttl(args.ttl)
            .start()
            .await?;
        tokio::select! {
            r = serve(&session, &mut store, &args) => {
                if let Err(e) = r {
                    println!("{}: {e}: a new session", args.name);
                }
            }
            _ = shutdown_signal() => {
                session.close().await?;
                return Ok(());
            }
        }
    }
}
