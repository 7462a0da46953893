//! An etcd member paused (`SIGSTOP`) after the client connected — a follower, then the leader:
//! a stopped process still accepts connections, and what is sent to it waits. The session must
//! stay live and locks keep being granted through the other members (at most the acquisitions
//! in flight on the paused member fail). (ZooKeeper's client talks to one server at a time; see
//! the README on a hung ZooKeeper server.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::SessionState;
use fencelock_integration::servers::etcd::EtcdCluster;
use fencelock_integration::servers::{available, Cluster};
use fencelock_integration::target::Kind;

/// How long each member stays paused.
const PAUSE: Duration = Duration::from_secs(10);

/// Which members are paused, one after the other.
#[derive(Clone, Copy, PartialEq)]
enum Victims {
    FollowerThenLeader,
    Follower,
}

async fn run(cluster: Arc<dyn Cluster>, ttl: Duration, victims: Victims) {
    let s = cluster
        .target()
        .session(&fencelock::conformance::unique_namespace("paused"), ttl)
        .await;
    let leader = cluster.leader().await;
    let mut plan = vec![("follower", (leader + 1) % cluster.size())];
    if victims == Victims::FollowerThenLeader {
        plan.push(("leader", leader));
    }
    for (what, victim) in plan {
        let m = s.mutex("m").unwrap();
        cluster.pause(victim);
        let start = Instant::now();
        let (mut granted, mut failed) = (0, Vec::new());
        while start.elapsed() < PAUSE {
            match m.lock_timeout(ttl).await {
                Ok(g) => {
                    let _ = g.release().await;
                    granted += 1;
                }
                Err(e) => failed.push(e.to_string()),
            }
            assert!(
                !matches!(s.state(), SessionState::Lost(_)),
                "{:?}, {what} paused: the session was lost ({failed:?})",
                cluster.kind()
            );
        }
        cluster.resume(victim);
        println!(
            "{:?}, {what} paused for {PAUSE:?}: {granted} grants, {} failed ({failed:?})",
            cluster.kind(),
            failed.len()
        );
        assert!(granted >= 50, "{what} paused: only {granted} grants");
        assert!(failed.len() <= 3, "{what} paused: {failed:?}");
    }
    s.close().await.unwrap();
}

/// Each scenario in turn on one cluster (run side by side, two paused 3-member clusters load
/// the 2-core machine enough to cost a session its heartbeat):
/// - a follower, then the leader, paused at TTL 8 s;
/// - a follower paused at a short TTL (2 s: the local deadline is 1 s after a heartbeat's
///   send): no request may wait on it for longer than a third of the TTL, or the session is
///   lost. (A paused *leader* at this TTL costs the session: etcd's election takes about its 1 s
///   election timeout, so nothing can be confirmed before the deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_member_paused() {
    if !available(Kind::Etcd) {
        return;
    }
    let cluster: Arc<dyn Cluster> = Arc::new(
        tokio::task::spawn_blocking(|| EtcdCluster::start(3))
            .await
            .unwrap(),
    );
    run(
        cluster.clone(),
        Duration::from_secs(8),
        Victims::FollowerThenLeader,
    )
    .await;
    run(cluster, Duration::from_secs(2), Victims::Follower).await;
}
