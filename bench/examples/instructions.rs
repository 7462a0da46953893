//! Client instructions per acquisition, for `valgrind --tool=callgrind` (which counts them
//! alike on a noisy machine): run by `scripts/instructions.sh`, which prints the table.
//!
//! `instructions serve` starts one etcd member, one ZooKeeper server and one Redis server
//! (natively, not under valgrind) and prints their addresses; `instructions <what> <n> <address>` then takes and
//! releases one uncontended lock `n` times in one session on a single-threaded runtime
//! (`memory-fencelock`: the in-memory backend, the core's own cost; `redis-fencelock-4`,
//! `zookeeper-fencelock-4`, `zookeeper-client-lock-4`: four sessions
//! contend for one lock, `n` acquisitions in all, each handed over by the release before it).
//! The script runs each `what` twice (`n` = 50 and 250) under callgrind: the difference over
//! 200 acquisitions leaves out the start (connecting, the session, TLS provider set-up).

use std::time::Duration;

use fencelock::Session;
use fencelock_integration::servers::etcd::EtcdCluster;
use fencelock_integration::servers::redis::{Durability, RedisServer};
use fencelock_integration::servers::zookeeper::ZkEnsemble;
use fencelock_integration::servers::Cluster;
use zookeeper_client as zk;

/// Every `what`: ours and the peers', on etcd, ZooKeeper and Redis.
const WHAT: [&str; 13] = [
    "memory-fencelock",
    "etcd-fencelock",
    "etcd-client-lock",
    "etcd-raw-txn",
    "zookeeper-fencelock",
    "zookeeper-fencelock-4",
    "zookeeper-client-lock",
    "zookeeper-client-lock-4",
    "zookeeper-raw",
    "redis-fencelock",
    "redis-fencelock-4",
    "redis-rslock",
    "redis-bare",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [serve] if serve == "serve" => {
            let etcd = EtcdCluster::start(1);
            let zookeeper = ZkEnsemble::start(1);
            let redis = RedisServer::start(Durability::None);
            println!(
                "{} {} {}",
                etcd.endpoint(0),
                zookeeper.connect_string(),
                redis.url()
            );
            // Until the script's SIGTERM (or SIGINT): then the harnesses are dropped, which
            // stops the servers and removes their data dirs (killed without a drop, each run
            // left ~60 MB in /dev/shm).
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(async {
                    use tokio::signal::unix::{signal, SignalKind};
                    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
                    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                });
            drop((etcd, zookeeper, redis));
        }
        [what, n, address] if WHAT.contains(&what.as_str()) => {
            let n: usize = n.parse().expect("a count");
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(run(what, n, address));
        }
        _ => {
            eprintln!(
                "usage: instructions serve | instructions <what> <n> <address>; what: {WHAT:?}"
            );
            std::process::exit(2);
        }
    }
}

async fn run(what: &str, n: usize, address: &str) {
    match what {
        "memory-fencelock" => {
            // The core's own cost: the in-memory backend does next to nothing per request.
            mutex_rounds(
                Session::builder(fencelock::MemoryBackend::new()).namespace("instructions"),
                n,
            )
            .await;
        }
        "etcd-fencelock" => {
            let b = fencelock_etcd::EtcdBackend::connect([address])
                .await
                .unwrap();
            mutex_rounds(Session::builder(b).namespace("instructions"), n).await;
        }
        "etcd-client-lock" => {
            let mut c = etcd_client::Client::connect([address], None).await.unwrap();
            let lease = c.lease_grant(60, None).await.unwrap().id();
            for _ in 0..n {
                let options = etcd_client::LockOptions::new().with_lease(lease);
                let key = c.lock("instructions-lock", Some(options)).await.unwrap();
                c.unlock(key.key().to_vec()).await.unwrap();
            }
        }
        "etcd-raw-txn" => {
            use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
            let mut c = etcd_client::Client::connect([address], None).await.unwrap();
            let lease = c.lease_grant(60, None).await.unwrap().id();
            let key = format!("instructions-raw/{lease:x}");
            for _ in 0..n {
                let put = TxnOp::put(key.as_str(), "", Some(PutOptions::new().with_lease(lease)));
                let txn = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([put]);
                c.txn(txn).await.unwrap();
                c.delete(key.as_str(), None).await.unwrap();
            }
        }
        "zookeeper-fencelock" => {
            let b = fencelock_zookeeper::ZooKeeperBackend::builder(address)
                .connect()
                .await
                .unwrap();
            mutex_rounds(Session::builder(b).namespace("instructions"), n).await;
        }
        "zookeeper-fencelock-4" => {
            let mut sessions = Vec::new();
            for _ in 0..4 {
                let b = fencelock_zookeeper::ZooKeeperBackend::builder(address)
                    .connect()
                    .await
                    .unwrap();
                sessions.push(Session::builder(b));
            }
            contended_rounds(sessions, n).await;
        }
        "zookeeper-client-lock" => zk_recipe_rounds(zk_client(address).await, n).await,
        "zookeeper-client-lock-4" => {
            let mut rounds = Vec::new();
            for _ in 0..4 {
                rounds.push(zk_recipe_rounds(zk_client(address).await, n / 4));
            }
            futures::future::join_all(rounds).await;
        }
        "zookeeper-raw" => {
            let c = zk_client(address).await;
            let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            let _ = c.create("/instructions-raw", b"", &open).await;
            let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            for _ in 0..n {
                let (_, seq) = c.create("/instructions-raw/n-", b"", &mode).await.unwrap();
                c.delete(&format!("/instructions-raw/n-{seq}"), None)
                    .await
                    .unwrap();
            }
        }
        "redis-fencelock" => {
            let b = fencelock_redis::RedisBackend::connect(address)
                .await
                .unwrap();
            mutex_rounds(Session::builder(b).namespace("instructions"), n).await;
        }
        "redis-fencelock-4" => {
            let mut sessions = Vec::new();
            for _ in 0..4 {
                let b = fencelock_redis::RedisBackend::connect(address)
                    .await
                    .unwrap();
                sessions.push(Session::builder(b));
            }
            contended_rounds(sessions, n).await;
        }
        "redis-rslock" => {
            let lm = rslock::LockManager::new(vec![address.to_string()]);
            for _ in 0..n {
                let lock = lm
                    .acquire_no_guard(b"instructions-rslock", Duration::from_secs(10))
                    .await
                    .unwrap();
                lm.unlock(&lock).await;
            }
        }
        "redis-bare" => {
            // SET NX PX, then a compare-and-delete script: the floor.
            let client = redis::Client::open(address).unwrap();
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            let delete = redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            );
            for i in 0..n {
                let token = i.to_string();
                let set: Option<String> = redis::cmd("SET")
                    .arg("instructions-bare")
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(10_000)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                assert!(set.is_some());
                let _: i64 = delete
                    .key("instructions-bare")
                    .arg(&token)
                    .invoke_async(&mut con)
                    .await
                    .unwrap();
            }
        }
        _ => unreachable!("checked in main"),
    }
}

/// `n` rounds of our mutex's lock + release in a session of `builder`.
async fn mutex_rounds(builder: fencelock::SessionBuilder, n: usize) {
    let s = builder.start().await.unwrap();
    let m = s.mutex("instructions").unwrap();
    for _ in 0..n {
        m.lock().await.unwrap().release().await.unwrap();
    }
    s.close().await.unwrap();
}

/// The sessions of `builders` contending for one lock: `n` acquisitions in all, each a handoff.
async fn contended_rounds(builders: Vec<fencelock::SessionBuilder>, n: usize) {
    let per = n / builders.len().max(1);
    let rounds = builders
        .into_iter()
        .map(|b| mutex_rounds(b.namespace("instructions"), per));
    futures::future::join_all(rounds).await;
}

/// `n` rounds of zookeeper-client's lock recipe (Curator's naming, container parents) and a
/// confirmed delete.
async fn zk_recipe_rounds(c: zk::Client, n: usize) {
    let open = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let options = zk::LockOptions::new(zk::Acls::anyone_all())
        .with_ancestor_options(open)
        .unwrap();
    for _ in 0..n {
        let prefix = zk::LockPrefix::new_curator("/instructions-lock", "lock-").unwrap();
        let lock = c.lock(prefix, b"", options.clone()).await.unwrap();
        c.delete(lock.lock_path(), None).await.unwrap();
        // Released above, confirmed: skip the drop's background delete.
        std::mem::forget(lock);
    }
}

async fn zk_client(address: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(address)
        .await
        .unwrap()
}
