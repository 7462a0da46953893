//! Interoperability with Apache Curator's `InterProcessReadWriteLock`, `InterProcessSemaphoreV2`
//! and revocation (`makeRevocable`, `Revoker`), each Curator client in a JVM of its own (see
//! `zookeeper_curator.rs` for the mutex and the leader latch). Skipped with a message when
//! java, javac or the jars are missing (a failure in CI).

use std::time::Duration;

use fencelock::conformance::{bounded, unique_namespace, wait_entries, WAIT};
use fencelock_integration::curator::{self as java, assert_curator_name, CuratorProgram};

/// How long the side that waits is watched not to be granted.
const BLOCKED_FOR: Duration = Duration::from_millis(1500);

/// One queue, both libraries, FIFO across them: a Curator reader and ours read together; our
/// writer queues behind both; a Curator writer behind ours; a Curator reader behind that. Each
/// is granted in turn, with tokens (czxids) increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_lock_shared_with_curator() {
    let Some((f, classes)) = java::with_zookeeper().await else {
        return;
    };
    let ns = unique_namespace("zk_curator_rw");
    let path = format!("/{ns}/catalog");
    let connect = f.server().connect_string();
    let start =
        |recipe: &str| CuratorProgram::recipe(&classes, &connect, &path, recipe, WAIT, WAIT * 2);
    let (s, t) = (f.session(&ns).await, f.session(&ns).await);

    let mut r1 = start("read");
    r1.expect("STARTED", WAIT).await;
    let (r1_czxid, r1_node) = r1.acquired(WAIT).await;
    assert_curator_name(&r1_node, &path, "__READ__");
    let ours_r = bounded(
        WAIT,
        "our read beside Curator's",
        s.rwlock("catalog").unwrap().read(),
    )
    .await
    .unwrap();
    assert_curator_name(ours_r.key(), &path, "__READ__");
    assert!(s
        .rwlock("catalog")
        .unwrap()
        .try_write()
        .await
        .unwrap()
        .is_none());

    let writer = tokio::spawn({
        let l = t.rwlock("catalog").unwrap();
        async move { l.write().await }
    });
    wait_entries(&s, "our writer queued", |l| l.len() == 3).await;
    let mut w2 = start("write");
    w2.expect("STARTED", WAIT).await;
    wait_entries(&s, "Curator's writer queued", |l| l.len() == 4).await;
    let mut r3 = start("read");
    r3.expect("STARTED", WAIT).await;
    wait_entries(&s, "Curator's reader queued", |l| l.len() == 5).await;

    r1.release(WAIT).await;
    ours_r.release().await.unwrap();
    let ours_w = bounded(WAIT, "our writer granted", writer)
        .await
        .unwrap()
        .unwrap();
    assert_curator_name(ours_w.key(), &path, "__WRIT__");
    assert!(ours_w.token().get() > r1_czxid && ours_w.token() > ours_r.token());
    assert_eq!(
        w2.next_line(BLOCKED_FOR).await,
        None,
        "Curator's writer waits for ours"
    );
    ours_w.release().await.unwrap();
    let (w2_czxid, w2_node) = w2.acquired(WAIT).await;
    assert_curator_name(&w2_node, &path, "__WRIT__");
    assert!(w2_czxid > ours_w.token().get());
    assert_eq!(
        r3.next_line(BLOCKED_FOR).await,
        None,
        "a later reader waits for the writer"
    );
    assert!(t
        .rwlock("catalog")
        .unwrap()
        .try_read()
        .await
        .unwrap()
        .is_none());
    w2.release(WAIT).await;
    let (r3_czxid, _) = r3.acquired(WAIT).await;
    assert!(r3_czxid > w2_czxid);
    // Our reader joins Curator's.
    let again = bounded(
        WAIT,
        "read beside Curator's",
        s.rwlock("catalog").unwrap().read(),
    )
    .await
    .unwrap();
    again.release().await.unwrap();
    r3.release(WAIT).await;
    for p in [&mut r1, &mut w2, &mut r3] {
        assert_eq!(p.wait_exit(WAIT).await.code(), Some(0));
    }
    wait_entries(&s, "every entry gone", |l| l.is_empty()).await;
    s.close().await.unwrap();
    t.close().await.unwrap();
}

/// Two permits shared by Curator's `InterProcessSemaphoreV2` and ours, on one path: a Curator
/// lease and ours fill it; another Curator acquirer waits until we release ours; we then wait
/// until Curator releases one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_shared_with_curator() {
    let Some((f, classes)) = java::with_zookeeper().await else {
        return;
    };
    let ns = unique_namespace("zk_curator_sem");
    let path = format!("/{ns}/pool");
    let connect = f.server().connect_string();
    let start =
        |recipe: &str| CuratorProgram::recipe(&classes, &connect, &path, recipe, WAIT, WAIT * 2);
    let s = f.session(&ns).await;
    let sem = s.semaphore("pool", 2).unwrap();

    let mut c1 = start("semaphore:2");
    c1.expect("STARTED", WAIT).await;
    let (c1_czxid, c1_node) = c1.acquired(WAIT).await;
    assert_curator_name(&c1_node, &format!("{path}/leases"), "lease-");
    let p = bounded(WAIT, "our permit", sem.acquire()).await.unwrap();
    assert_curator_name(p.key(), &format!("{path}/leases"), "lease-");
    assert!(p.token().get() > c1_czxid);
    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "both permits taken"
    );

    let mut c2 = start("semaphore:2");
    c2.expect("STARTED", WAIT).await;
    assert_eq!(
        c2.next_line(BLOCKED_FOR).await,
        None,
        "Curator waits: no permit"
    );
    p.release().await.unwrap();
    let (c2_czxid, _) = c2.acquired(WAIT).await;
    assert!(c2_czxid > p.token().get());

    let waiter = tokio::spawn({
        let sem = s.semaphore("pool", 2).unwrap();
        async move { sem.acquire().await }
    });
    tokio::time::sleep(BLOCKED_FOR).await;
    assert!(!waiter.is_finished(), "we wait: no permit");
    c1.release(WAIT).await;
    let q = bounded(WAIT, "our permit after Curator's release", waiter)
        .await
        .unwrap()
        .unwrap();
    let (holders, waiting) = sem.inspect().await.unwrap();
    assert_eq!(holders.len(), 2);
    assert!(waiting.is_empty(), "the gate is free");
    q.release().await.unwrap();
    c2.release(WAIT).await;
    wait_entries(&s, "every lease gone", |l| l.is_empty()).await;
    s.close().await.unwrap();
}

/// Revocation requests cross libraries: ours reaches a Curator holder made revocable (which
/// releases, letting our waiter in), and Curator's `Revoker` reaches our holder's
/// `revoke_requested()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_requests_cross_with_curator() {
    let Some((f, classes)) = java::with_zookeeper().await else {
        return;
    };
    let ns = unique_namespace("zk_curator_revoke");
    let path = format!("/{ns}/r");
    let connect = f.server().connect_string();
    let s = f.session(&ns).await;
    let m = s.mutex("r").unwrap();

    let mut holder = CuratorProgram::recipe(&classes, &connect, &path, "revocable", WAIT, WAIT * 2);
    holder.expect("STARTED", WAIT).await;
    let (czxid, node) = holder.acquired(WAIT).await;
    let waiter = tokio::spawn({
        let m = s.mutex("r").unwrap();
        async move { m.lock().await }
    });
    wait_entries(&s, "our waiter queued", |l| l.len() == 2).await;
    let asked = m.request_revoke().await.unwrap().expect("Curator holds");
    assert_eq!(
        (asked.key.as_str(), asked.token.get()),
        (node.as_str(), czxid)
    );
    holder.expect("REVOKE_REQUESTED", WAIT).await;
    holder.expect("RELEASED", WAIT).await;
    let g = bounded(WAIT, "granted after Curator let go", waiter)
        .await
        .unwrap()
        .unwrap();

    let requested = g.revoke_requested();
    let mut revoker = CuratorProgram::recipe(
        &classes,
        &connect,
        &path,
        &format!("revoke:{}", g.key()),
        WAIT,
        WAIT,
    );
    revoker.expect("REVOKE_SENT", WAIT).await;
    bounded(WAIT, "Curator's request reached us", requested).await;
    assert!(g.is_held());
    g.release().await.unwrap();
    s.close().await.unwrap();
}
