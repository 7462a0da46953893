//! No thundering herd, counted by the servers themselves: contended acquisitions of a mutex, a
//! read-write lock and a semaphore, each release waking one waiter (at most one watch
//! notification per acquisition, whatever the number of waiters). Each backend gets a server of
//! its own, so that no other test's notifications are counted.

use std::time::Duration;

use fencelock::Session;
use fencelock_integration::bench::family::{our_op, Load};
use fencelock_integration::notifications::Notifications;
use fencelock_integration::servers::etcd::{self as etcd_harness, EtcdCluster};
use fencelock_integration::servers::zookeeper::{ZkEnsemble, MIN_SESSION_TIMEOUT};
use fencelock_integration::servers::{available, Cluster};
use fencelock_integration::target::Kind;

const SESSIONS: usize = 6;
const ROUNDS: usize = 15;

/// Runs every load with `SESSIONS` sessions × `ROUNDS` acquisitions; asserts at most `limit`
/// notifications per acquisition for each.
async fn check_loads(sessions: Vec<Session>, counter: &Notifications, limit: f64) {
    for (i, load) in [Load::Mutex, Load::ReadHeavy, Load::Semaphore(2)]
        .into_iter()
        .enumerate()
    {
        let name = format!("herd-{i}");
        let before = counter.read().await.expect("read the server's counter");
        let mut tasks = Vec::new();
        for s in &sessions {
            let mut op = our_op(s.clone(), load, &name);
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    op().await;
                }
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(120), t)
                .await
                .expect("the workload finishes")
                .unwrap();
        }
        let after = counter.read().await.expect("read the server's counter");
        let per = (after - before) / (SESSIONS * ROUNDS) as f64;
        println!("{load:?}: {per:.2} notifications per acquisition");
        assert!(
            per <= limit,
            "{load:?}: {per:.2} notifications per acquisition with {SESSIONS} sessions (a herd?)"
        );
        assert!(
            after > before,
            "{load:?}: contended, yet nobody was ever woken"
        );
    }
    for s in sessions {
        s.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_release_wakes_one_waiter() {
    if !available(Kind::Etcd) {
        return;
    }
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .unwrap();
    let ep = cluster.endpoint(0);
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        let b = etcd_harness::connect(std::slice::from_ref(&ep)).await;
        sessions.push(Session::builder(b).namespace("herd").start().await.unwrap());
    }
    check_loads(sessions, &Notifications::Etcd(ep), 1.3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_release_wakes_one_waiter() {
    if !available(Kind::ZooKeeper) {
        return;
    }
    let server = tokio::task::spawn_blocking(|| ZkEnsemble::start(1))
        .await
        .unwrap();
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        let b = fencelock_zookeeper::ZooKeeperBackend::builder(server.connect_string())
            .min_ttl(MIN_SESSION_TIMEOUT)
            .connect()
            .await
            .unwrap();
        sessions.push(Session::builder(b).namespace("herd").start().await.unwrap());
    }
    check_loads(sessions, &Notifications::ZooKeeper(server.port(0)), 1.3).await;
}
