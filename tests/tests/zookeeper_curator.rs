//! Interoperability with Apache Curator's `InterProcessMutex`, run in a JVM of its own (Debian's
//! `libcurator-recipes-java`; the program is `tests/java/CuratorMutex.java`, compiled at test
//! time): Curator and fencelock contend on the same queue `/{namespace}/{lock}`. Skipped with a
//! message when java, javac or the jars are missing (a failure in CI). By hand:
//! `scripts/curator-interop.sh`.

use std::sync::Arc;
use std::time::Duration;

use fencelock::conformance::{bounded, unique_namespace, wait_entries, TTL, WAIT};
use fencelock::{Fence, FencingToken, Session};
use fencelock_integration::curator::{
    self as java, assert_curator_name, CuratorMutex, JavaClasses,
};
use fencelock_integration::servers::zookeeper::ZkFactory;

async fn session(f: &ZkFactory, ns: &str) -> Session {
    Session::builder(f.zookeeper().clone())
        .namespace(ns)
        .ttl(TTL)
        .start()
        .await
        .expect("session")
}

/// How long the side that waits is watched not to be granted.
const BLOCKED_FOR: Duration = Duration::from_millis(1500);

async fn setup() -> Option<(ZkFactory, Arc<JavaClasses>)> {
    let f = ZkFactory::shared().await?;
    if !java::available() {
        return None;
    }
    let classes = tokio::task::spawn_blocking(java::programs)
        .await
        .expect("compile the Java programs");
    Some((f, classes))
}

/// Curator holds the `InterProcessMutex` on `/{ns}/{lock}`: our `lock()` queues behind its
/// node and waits; once Curator releases, we are granted, with a token above Curator's
/// `czxid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_holder_keeps_our_lock_waiting() {
    let Some((f, classes)) = setup().await else {
        return;
    };
    let ns = unique_namespace("zk_curator_holds");
    let path = format!("/{ns}/jobs/reindex");
    let mut java = CuratorMutex::spawn(
        &classes,
        &f.server().connect_string(),
        &path,
        WAIT,
        WAIT * 2,
    );
    java.expect("STARTED", WAIT).await;
    let (java_czxid, java_node) = java.acquired(WAIT).await;
    assert_curator_name(&java_node, &path, "lock-");

    let s = session(&f, &ns).await;
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
    let Some((f, classes)) = setup().await else {
        return;
    };
    let ns = unique_namespace("zk_we_hold");
    let path = format!("/{ns}/m");
    let connect = f.server().connect_string();
    let s = session(&f, &ns).await;
    let m = s.mutex("m").unwrap();
    let g = m.lock().await.unwrap();

    // A bounded acquire times out while we hold, and leaves no node behind.
    let mut short = CuratorMutex::spawn(&classes, &connect, &path, Duration::from_secs(1), WAIT);
    short.expect("STARTED", WAIT).await;
    short.expect("TIMEOUT", WAIT).await;
    assert_eq!(short.wait_exit(WAIT).await.code(), Some(2));
    wait_entries(&s, "Curator's timed-out node gone", |l| l.len() == 1).await;

    let mut java = CuratorMutex::spawn(&classes, &connect, &path, WAIT, WAIT * 2);
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
