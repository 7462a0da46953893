//! Interoperability with Apache Curator's `InterProcessMutex`, run in a JVM of its own (Debian's
//! `libcurator-recipes-java`; the programs are `tests/java/Curator*.java`, compiled at test
//! time): Curator and fencelock contend on the same queue `/{namespace}/{lock}`. Skipped with a
//! message when java, javac or the jars are missing (a failure in CI). By hand:
//! `scripts/curator-interop.sh`.

use std::time::Duration;

use fencelock::conformance::{bounded, unique_namespace, wait_entries, WAIT};
use fencelock::{Fence, FencingToken};
use fencelock_integration::curator::{self as java, assert_curator_name, CuratorProgram};

/// How long the side that waits is watched not to be granted.
const BLOCKED_FOR: Duration = Duration::from_millis(1500);

/// Curator holds the `InterProcessMutex` on `/{ns}/{lock}`: our `lock()` queues behind its
/// node and waits; once Curator releases, we are granted, with a token above Curator's
/// `czxid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_holder_keeps_our_lock_waiting() {
    let Some((f, classes)) = java::with_zookeeper().await else {
        return;
    };
    let ns = unique_namespace("zk_curator_holds");
    let path = format!("/{ns}/jobs/reindex");
    let mut java = CuratorProgram::mutex(
        &classes,
        &f.server().connect_string(),
        &path,
        WAIT,
        WAIT * 2,
    );
    java.expect("STARTED", WAIT).await;
    let (java_czxid, java_node) = java.acquired(WAIT).await;
    assert_curator_name(&java_node, &path, "lock-");

    let s = f.session(&ns).await;
    let m = s.mutex("jobs/reindex").unwrap();
    assert!(
        m.try_lock().await.unwrap().is_none(),
        "Curator holds the lock"
    );
    let waiter = tokio::spawn(async move { m.lock().await });
    wait_entries(&s, "our entry queued behind Curator's", |l| l.len() == 2).await;
    tokio::time::sleep(BLOCKED_FOR).await;
    assert!(
        !waiter.is_finished(),
        "our lock() must wait while Curator holds"
    );

    java.release(WAIT).await;
    let g = bounded(WAIT, "granted once Curator released", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(g.is_held());
    assert!(
        g.token().get() > java_czxid,
        "our token {} above Curator's czxid {java_czxid}",
        g.token()
    );
    let fence = Fence::new();
    fence.admit(g.token()).unwrap();
    assert!(
        fence.admit(FencingToken::new(java_czxid)).is_err(),
        "the previous (Curator) holder's czxid is fenced off"
    );
    assert_eq!(java.wait_exit(WAIT).await.code(), Some(0));
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// We hold: Curator's `acquire(timeout)` gives up, and a waiting `acquire()` queues behind
/// our node and is granted only after our release, with a `czxid` above our token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_holder_keeps_curator_waiting() {
    let Some((f, classes)) = java::with_zookeeper().await else {
        return;
    };
    let ns = unique_namespace("zk_we_hold");
    let path = format!("/{ns}/m");
    let connect = f.server().connect_string();
    let s = f.session(&ns).await;
    let m = s.mutex("m").unwrap();
    let g = m.lock().await.unwrap();

    // A bounded acquire times out while we hold, and leaves no node behind.
    let mut short = CuratorProgram::mutex(&classes, &connect, &path, Duration::from_secs(1), WAIT);
    short.expect("STARTED", WAIT).await;
    short.expect("TIMEOUT", WAIT).await;
    assert_eq!(short.wait_exit(WAIT).await.code(), Some(2));
    wait_entries(&s, "Curator's timed-out node gone", |l| l.len() == 1).await;

    let mut java = CuratorProgram::mutex(&classes, &connect, &path, WAIT, WAIT * 2);
    java.expect("STARTED", WAIT).await;
    wait_entries(&s, "Curator's entry queued behind ours", |l| l.len() == 2).await;
    assert_eq!(
        java.next_line(BLOCKED_FOR).await,
        None,
        "Curator must wait while we hold"
    );
    assert!(g.is_held());

    let ours = g.token();
    g.release().await.unwrap();
    let (java_czxid, java_node) = java.acquired(WAIT).await;
    assert_curator_name(&java_node, &path, "lock-");
    assert!(
        java_czxid > ours.get(),
        "Curator's czxid {java_czxid} above our token {ours}"
    );
    assert!(
        m.try_lock().await.unwrap().is_none(),
        "Curator holds the lock now"
    );

    java.release(WAIT).await;
    assert_eq!(java.wait_exit(WAIT).await.code(), Some(0));
    let g2 = bounded(WAIT, "ours again", m.lock()).await.unwrap();
    assert!(g2.token().get() > java_czxid);
    g2.release().await.unwrap();
    s.close().await.unwrap();
}

/// A Curator `LeaderLatch` queued behind a fencelock leader that proclaims new values takes over
/// when that leader resigns. (Curator's follower watches the leader's node with a one-shot watch
/// and acts only on its deletion: had the proclaim changed that node's data, the watch would be
/// used up and the follower stranded. fencelock keeps proclaimed values elsewhere.) Meanwhile
/// fencelock's `leader()` reports the proclaimed value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_latch_takes_over_after_our_leader_proclaimed() {
    let Some((f, classes)) = java::with_zookeeper().await else {
        return;
    };
    for end in ["resign", "close the session"] {
        let ns = unique_namespace("zk_latch_follower");
        let path = format!("/{ns}/primary");
        let s = f.session(&ns).await;
        let e = s.election("primary").unwrap();
        let ours = e.campaign(b"ours-1").await.unwrap();
        let mut java = CuratorProgram::latch(
            &classes,
            &f.server().connect_string(),
            &path,
            "curator-b",
            WAIT,
        );
        let node = java.expect("STARTED", WAIT).await;
        assert_curator_name(&node, &path, "latch-");
        ours.proclaim(b"ours-2").await.unwrap();
        ours.proclaim(b"ours-3").await.unwrap();
        let info = e.leader().await.unwrap().expect("a leader");
        assert_eq!(
            (info.value.as_slice(), info.epoch),
            (&b"ours-3"[..], ours.epoch())
        );
        assert_eq!(
            java.next_line(BLOCKED_FOR).await,
            None,
            "Curator waits while we lead"
        );
        match end {
            "resign" => ours.resign().await.unwrap(),
            _ => s.close().await.unwrap(),
        }
        let (czxid, leader_node) = java.leading(WAIT).await;
        assert_eq!(leader_node, node);
        assert!(czxid > ours.epoch().get());
        if end == "resign" {
            let info = e.leader().await.unwrap().expect("Curator leads");
            assert_eq!(
                (info.value.as_slice(), info.epoch.get()),
                (&b"curator-b"[..], czxid)
            );
            s.close().await.unwrap();
        }
        java.close(WAIT).await;
        assert_eq!(java.wait_exit(WAIT).await.code(), Some(0));
    }
}

/// We campaign behind a Curator `LeaderLatch` leader: we wait while it leads, and lead once it
/// closes its latch, with an epoch above its node's czxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_take_over_from_a_curator_latch() {
    let Some((f, classes)) = java::with_zookeeper().await else {
        return;
    };
    let ns = unique_namespace("zk_latch_leader");
    let path = format!("/{ns}/primary");
    let mut java = CuratorProgram::latch(
        &classes,
        &f.server().connect_string(),
        &path,
        "curator-a",
        WAIT,
    );
    java.expect("STARTED", WAIT).await;
    let (czxid, _) = java.leading(WAIT).await;
    let s = f.session(&ns).await;
    let e = s.election("primary").unwrap();
    assert_eq!(
        e.leader().await.unwrap().map(|l| l.epoch.get()),
        Some(czxid)
    );
    let campaign = tokio::spawn({
        let e = s.election("primary").unwrap();
        async move { e.campaign(b"ours").await }
    });
    wait_entries(&s, "our candidate queued", |l| l.len() == 2).await;
    tokio::time::sleep(BLOCKED_FOR).await;
    assert!(!campaign.is_finished(), "we wait while Curator leads");
    java.close(WAIT).await;
    let ours = bounded(WAIT, "we lead", campaign).await.unwrap().unwrap();
    assert!(ours.epoch().get() > czxid);
    ours.proclaim(b"ours-2").await.unwrap();
    assert_eq!(e.leader().await.unwrap().unwrap().value, b"ours-2");
    ours.resign().await.unwrap();
    s.close().await.unwrap();
}
