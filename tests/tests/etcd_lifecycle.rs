//! An etcd session's lifecycle against real members that die and come back: a cluster with a
//! member down still connects and starts every time; a broken stream suspends the session at
//! once; a lease that etcd revives after an outage longer than its TTL does not block the lock.
//! Run with `--nocapture` to see the measured times.

use std::time::{Duration, Instant};

use fencelock::conformance::{bounded, unique_namespace, WAIT};
use fencelock::{Session, SessionEnd, SessionState};
use fencelock_etcd::EtcdBackend;
use fencelock_integration::servers::etcd::EtcdCluster;
use fencelock_integration::servers::{available, Cluster};
use fencelock_integration::target::Kind;
use futures::StreamExt;

async fn cluster(size: usize) -> Option<EtcdCluster> {
    if !available(Kind::Etcd) {
        return None;
    }
    Some(
        tokio::task::spawn_blocking(move || EtcdCluster::start(size))
            .await
            .unwrap(),
    )
}

/// With one member of three stopped (and, separately, an endpoint where nothing ever ran),
/// every one of 20 connects, session starts and lock round trips succeeds, whatever the order
/// of the endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_down_never_fails_a_connect_or_start() {
    let Some(c) = cluster(3).await else { return };
    let _ = c.leader().await;
    c.kill(0);
    let dead = c.endpoint(0);
    let never = format!("127.0.0.1:{}", fencelock_integration::free_port());
    let live = [c.endpoint(1), c.endpoint(2)];
    let orders = [
        vec![dead.clone(), live[0].clone(), live[1].clone()],
        vec![live[0].clone(), dead.clone(), live[1].clone()],
        vec![never.clone(), live[1].clone()],
    ];
    let ns = unique_namespace("member_down");
    let start = Instant::now();
    let mut rounds = 0;
    for order in &orders {
        for _ in 0..7 {
            let b = EtcdBackend::connect(order)
                .await
                .unwrap_or_else(|e| panic!("connect {order:?}: {e:?}"));
            let s = Session::builder(b)
                .namespace(&ns)
                .start()
                .await
                .unwrap_or_else(|e| panic!("start {order:?}: {e:?}"));
            for _ in 0..3 {
                let g = s.mutex("m").unwrap().lock().await.unwrap();
                g.release().await.unwrap();
            }
            s.close().await.unwrap();
            rounds += 1;
        }
    }
    println!(
        "{rounds} connect + start + 3 lock rounds with a member down: all succeeded ({:?} in all)",
        start.elapsed()
    );
}

/// The session reports `Suspended` as soon as its keep-alive stream breaks (the member killed),
/// long before its next heartbeat is due, and `Live` again once the member is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspended_as_soon_as_the_stream_breaks() {
    let Some(c) = cluster(1).await else { return };
    let b = EtcdBackend::connect([c.endpoint(0)]).await.unwrap();
    let ttl = Duration::from_secs(6);
    let s = Session::builder(b).ttl(ttl).start().await.unwrap();
    let mut states = Box::pin(s.state_changes());
    assert_eq!(states.next().await, Some(SessionState::Live));
    // The first heartbeat (after ttl/3) opens the keep-alive stream and moves the deadline.
    let first = s.deadline();
    bounded(WAIT, "the first heartbeat", async {
        while s.deadline() == first {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The next heartbeat is 2 s away: a suspension sooner comes from the broken stream.
    let killed = Instant::now();
    c.kill(0);
    assert_eq!(
        bounded(WAIT, "suspended", states.next()).await,
        Some(SessionState::Suspended)
    );
    let suspended_after = killed.elapsed();
    println!("Suspended {suspended_after:?} after the member was killed (heartbeat period 2 s)");
    assert!(
        suspended_after < Duration::from_millis(1500),
        "{suspended_after:?}"
    );
    c.restart(0);
    assert_eq!(
        bounded(WAIT, "live again", states.next()).await,
        Some(SessionState::Live)
    );
    s.close().await.unwrap();
}

/// An outage longer than the TTL: the holder's session is lost by its local deadline; etcd
/// comes back and revives every lease with a fresh TTL, the holder's included. The lost
/// session revokes its lease as soon as etcd answers, so a new session gets the lock in well
/// under a TTL (without the revoke it would wait a TTL and more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revived_lease_does_not_block_the_lock() {
    let Some(c) = cluster(1).await else { return };
    let ttl = Duration::from_secs(3);
    let ns = unique_namespace("revived");
    let a = Session::builder(EtcdBackend::connect([c.endpoint(0)]).await.unwrap())
        .namespace(&ns)
        .ttl(ttl)
        .start()
        .await
        .unwrap();
    let g = a.mutex("m").unwrap().lock().await.unwrap();
    c.kill(0);
    assert_eq!(
        bounded(ttl * 3, "the holder steps down", a.lost()).await,
        SessionEnd::LocalDeadline
    );
    assert!(!g.is_held());
    tokio::time::sleep(ttl).await;
    c.restart(0);
    let listening = Instant::now();
    let b = Session::builder(EtcdBackend::connect([c.endpoint(0)]).await.unwrap())
        .namespace(&ns)
        .ttl(ttl)
        .start()
        .await
        .unwrap();
    let serving = Instant::now();
    let gb = bounded(
        WAIT,
        "the lock after the outage",
        b.mutex("m").unwrap().lock(),
    )
    .await
    .unwrap();
    let waited = serving.elapsed();
    println!(
        "re-acquired {waited:?} after etcd served again ({:?} after it listened: its own election included; TTL {ttl:?})",
        listening.elapsed()
    );
    assert!(
        waited < ttl,
        "{waited:?}: the revived lease blocked the lock"
    );
    assert!(gb.token() > g.token());
    gb.release().await.unwrap();
    b.close().await.unwrap();
}

/// Endpoints of two different clusters are refused at the connect, as a configuration error
/// naming both cluster ids: a session lived on whichever answered first, and two processes
/// listing them in two orders each took "the" lock on its own cluster (black-box round 37).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_of_two_clusters_are_refused() {
    let (Some(one), Some(other)) = (cluster(1).await, cluster(1).await) else {
        return;
    };
    for order in [
        [one.endpoint(0), other.endpoint(0)],
        [other.endpoint(0), one.endpoint(0)],
    ] {
        match EtcdBackend::connect(&order).await {
            Err(fencelock::Error::InvalidConfig(e)) => {
                assert!(e.reason.contains("different etcd clusters"), "{e}")
            }
            other => panic!("{order:?}: {other:?}"),
        }
    }
    // One cluster's endpoints alone still connect.
    let b = EtcdBackend::connect([one.endpoint(0)]).await.unwrap();
    let s = Session::builder(b).start().await.unwrap();
    s.close().await.unwrap();
}
