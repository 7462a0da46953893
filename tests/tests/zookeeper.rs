//! The conformance suite and the ZooKeeper-specific behaviour against a real ZooKeeper server
//! (Debian's `zookeeper` package; skipped with a message when it is missing, a failure in CI).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::backend::{BackendSession, QueueId, QueueKind};
use fencelock::conformance::{bounded, unique_namespace, TTL, WAIT};
use fencelock::{Error, Session, SessionState};
use fencelock_integration::proxy::{Mode, Proxy};
use fencelock_integration::zookeeper::{
    self as harness, ZkFactory, MAX_SESSION_TIMEOUT, MIN_SESSION_TIMEOUT,
};
use fencelock_zookeeper::{AclMode, ZooKeeperBackend};
use zookeeper_client as zk;

fencelock::conformance_tests!(ZkFactory::shared());

/// A plain client of the test server, outside fencelock.
async fn raw(f: &ZkFactory) -> zk::Client {
    zk::Client::connect(&f.server().connect_string())
        .await
        .expect("raw client")
}

async fn session(f: &ZkFactory, ns: &str) -> Session {
    Session::builder(f.zookeeper().clone())
        .namespace(ns)
        .ttl(TTL)
        .start()
        .await
        .expect("session")
}

fn queue(ns: &str, name: &str, kind: QueueKind) -> QueueId {
    QueueId {
        namespace: ns.into(),
        name: name.into(),
        kind,
    }
}

/// `_c_{uuid}-{marker}{10 digits}` under `parent`.
fn assert_curator_name(key: &str, parent: &str, marker: &str) {
    let name = key
        .strip_prefix(&format!("{parent}/"))
        .unwrap_or_else(|| panic!("{key} is not a child of {parent}"));
    let rest = name.strip_prefix("_c_").expect("protected prefix _c_");
    let (uuid, seq) = rest.split_at(36);
    assert!(
        uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') && uuid.matches('-').count() == 4,
        "uuid part of {name}"
    );
    let seq = seq.strip_prefix(&format!("-{marker}")).expect("marker");
    assert!(
        seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()),
        "sequence of {name}"
    );
}

/// Lock and election entries follow Curator's node naming, the fencing token is the node's
/// `czxid`, the entry is an ephemeral of our session, and parents are CONTAINER nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_naming_and_czxid_token() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = unique_namespace("zk_naming");
    let s = session(&f, &ns).await;
    let zk = raw(&f).await;

    let g = s.mutex("jobs/reindex").unwrap().lock().await.unwrap();
    let parent = format!("/{ns}/jobs/reindex");
    assert_curator_name(g.key(), &parent, "lock-");
    let (_, stat) = zk.get_data(g.key()).await.unwrap();
    assert_eq!(g.token().get(), stat.czxid as u64, "token = czxid");
    assert_eq!(
        format!("{:x}", stat.ephemeral_owner as u64),
        s.id(),
        "our ephemeral"
    );

    let leader = s
        .election("primary")
        .unwrap()
        .campaign(b"node-a:8080")
        .await
        .unwrap();
    assert_curator_name(leader.key(), &format!("/{ns}/primary"), "latch-");
    let (data, stat) = zk.get_data(leader.key()).await.unwrap();
    assert_eq!(data, b"node-a:8080");
    assert_eq!(leader.epoch().get(), stat.czxid as u64, "epoch = czxid");
    assert!(leader.epoch() > g.token());

    // The empty namespace puts the queue at the root: /{name}.
    let root = Session::builder(f.zookeeper().clone())
        .namespace("")
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    let name = format!("fencelock-root-{}", &s.id());
    let g2 = root.mutex(&name).unwrap().lock().await.unwrap();
    assert_curator_name(g2.key(), &format!("/{name}"), "lock-");
    g2.release().await.unwrap();
    root.close().await.unwrap();

    g.release().await.unwrap();
    leader.resign().await.unwrap();
    assert!(s.list_entries().await.unwrap().is_empty());
    // Parents are CONTAINER nodes: the server reaps them once empty (the test server checks
    // every second).
    let start = Instant::now();
    while zk.check_stat(&parent).await.unwrap().is_some() {
        assert!(
            start.elapsed() < WAIT,
            "the empty parent {parent} was not reaped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.close().await.unwrap();
}

/// A non-protected Curator entry (`lock-{seq}`, no `_c_` prefix) created by another client
/// is ordered with ours: while it is first, we wait on it; its deletion grants us.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_curator_entry_is_ordered() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = unique_namespace("zk_foreign");
    let s = session(&f, &ns).await;
    let zk = raw(&f).await;
    let parent = format!("/{ns}/shared");
    let opts = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    zk.mkdir(&parent, &opts).await.unwrap();
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, seq) = zk
        .create(&format!("{parent}/lock-"), b"", &eph)
        .await
        .unwrap();
    let foreign = format!("{parent}/lock-{seq}");
    // Other children that are no lock entries are ignored.
    zk.create(&format!("{parent}/_c_x-latch-"), b"", &eph)
        .await
        .unwrap();

    let m = s.mutex("shared").unwrap();
    assert!(
        m.try_lock().await.unwrap().is_none(),
        "the foreign entry holds the lock"
    );
    let waiter = tokio::spawn(async move { m.lock().await.map(|g| g.token()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "waits behind the foreign entry");
    zk.delete(&foreign, None).await.unwrap();
    let t = bounded(WAIT, "granted after the foreign entry went", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(t.get() > 0);
    s.close().await.unwrap();
}

/// The create-succeeded-but-reply-lost case: a retry of the same attempt adopts the node
/// (same path, czxid as token) instead of creating a second one; a node with the same attempt
/// id owned by another session is never adopted; `abandon` deletes an unconfirmed node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_reply_is_recovered() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = unique_namespace("zk_lost_reply");
    let a = f.zookeeper().session(TTL).await.unwrap();
    let b = f.zookeeper().session(TTL).await.unwrap();
    let zk = raw(&f).await;
    let q = queue(&ns, "r", QueueKind::Lock);

    let attempt = "0f2a8f8e-9d2c-4e0e-8a50-0b1f5b3c1e2d".parse().unwrap();
    let created = a.create_reply_lost(&q, attempt, b"v").await.unwrap();
    let (entry, head) = a.enqueue(&q, attempt, b"v").await.unwrap();
    assert_eq!(entry.key, created, "adopted, not created again");
    assert!(head);
    let (_, stat) = zk.get_data(&entry.key).await.unwrap();
    assert_eq!(entry.token.get(), stat.czxid as u64);
    assert_eq!(
        a.list(&ns).await.unwrap(),
        vec![created.clone()],
        "one node"
    );

    // b's node carries the attempt id a believes it may have sent: a must not adopt it.
    let foreign_attempt = "6d3c1b5a-1111-4222-8333-944455566677".parse().unwrap();
    let b_node = b
        .create_reply_lost(&q, foreign_attempt, b"b")
        .await
        .unwrap();
    assert!(a.find_own(&q, foreign_attempt).await.unwrap().is_empty());
    assert_eq!(b.find_own(&q, foreign_attempt).await.unwrap().len(), 1);
    a.assume_create_sent(foreign_attempt);
    let (mine, head) = a.enqueue(&q, foreign_attempt, b"a2").await.unwrap();
    assert_ne!(mine.key, b_node, "another session's node is never adopted");
    assert!(!head);
    let (_, stat) = zk.get_data(&mine.key).await.unwrap();
    assert_eq!(format!("{:x}", stat.ephemeral_owner as u64), a.id());
    assert!(a.remove(&mine).await.unwrap());

    // Abandoning an attempt whose reply was lost deletes its node, and only ours.
    let lost = "7e3c1b5a-2222-4333-8444-a55566677788".parse().unwrap();
    let node = a.create_reply_lost(&q, lost, b"").await.unwrap();
    a.abandon(&q, lost).await.unwrap();
    assert!(
        zk.check_stat(&node).await.unwrap().is_none(),
        "abandoned node deleted"
    );
    a.abandon(&q, foreign_attempt).await.unwrap();
    assert!(
        zk.check_stat(&b_node).await.unwrap().is_some(),
        "b's node untouched"
    );

    assert!(a.remove(&entry).await.unwrap());
    assert!(
        !a.remove(&entry).await.unwrap(),
        "a second remove finds nothing"
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
    assert!(
        zk.check_stat(&b_node).await.unwrap().is_none(),
        "close deletes b's ephemerals"
    );
}

/// In creator-delete mode an unauthenticated client can read our entries but neither delete
/// nor change them nor queue in our parents; the owner releases normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_creator_delete() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let backend = ZooKeeperBackend::builder(f.server().connect_string())
        .min_ttl(MIN_SESSION_TIMEOUT)
        .digest_auth("alice", "s3cret")
        .acl(AclMode::CreatorDelete)
        .connect()
        .await
        .unwrap();
    // A top-level namespace, so that every parent is created in this mode.
    let ns = unique_namespace("zk_acl").replace('/', "-");
    let s = Session::builder(backend.clone())
        .namespace(&ns)
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    let g = s.mutex("guarded").unwrap().lock().await.unwrap();

    let anon = raw(&f).await;
    let (acl, _) = anon.get_acl(g.key()).await.unwrap();
    assert!(acl
        .iter()
        .any(|a| a.scheme() == "digest" && a.id().starts_with("alice:")));
    assert!(acl
        .iter()
        .any(|a| a.scheme() == "world" && a.permission() == zk::Permission::READ));
    assert!(anon.get_data(g.key()).await.is_ok(), "readable by all");
    assert_eq!(anon.delete(g.key(), None).await, Err(zk::Error::NoAuth));
    assert_eq!(
        anon.set_data(g.key(), b"x", None).await.map(drop),
        Err(zk::Error::NoAuth)
    );
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let parent = format!("/{ns}/guarded");
    assert_eq!(
        anon.create(&format!("{parent}/lock-"), b"", &eph)
            .await
            .map(drop),
        Err(zk::Error::NoAuth),
        "no foreign entries in our queue"
    );
    assert!(g.is_held());

    // Another process with the same identity contends normally.
    let s2 = Session::builder(backend)
        .namespace(&ns)
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    assert!(s2
        .mutex("guarded")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    g.release().await.unwrap();
    let g2 = s2.mutex("guarded").unwrap().lock().await.unwrap();
    g2.release().await.unwrap();
    s.close().await.unwrap();
    s2.close().await.unwrap();

    // Creator-delete without an identity is a configuration error.
    let r = ZooKeeperBackend::builder(f.server().connect_string())
        .acl(AclMode::CreatorDelete)
        .connect()
        .await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
}

/// The session reports the timeout the server negotiated, not the one requested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiated_ttl_is_reported() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let z = f.zookeeper();
    let low = z.session(Duration::from_millis(200)).await.unwrap();
    assert_eq!(
        low.ttl(),
        MIN_SESSION_TIMEOUT,
        "raised to the server's minimum"
    );
    let high = z.session(MAX_SESSION_TIMEOUT * 2).await.unwrap();
    assert_eq!(
        high.ttl(),
        MAX_SESSION_TIMEOUT,
        "lowered to the server's maximum"
    );
    let exact = z.session(Duration::from_secs(3)).await.unwrap();
    assert_eq!(exact.ttl(), Duration::from_secs(3));
    for s in [&low, &high, &exact] {
        assert!(
            u64::from_str_radix(&s.id(), 16).is_ok_and(|id| id != 0),
            "{}",
            s.id()
        );
        s.close().await.unwrap();
    }
    // Through the core: the session's TTL and deadline follow the negotiated value.
    let s = Session::builder(z.clone())
        .ttl(MAX_SESSION_TIMEOUT * 2)
        .start()
        .await
        .unwrap();
    assert_eq!(s.ttl(), MAX_SESSION_TIMEOUT);
    s.close().await.unwrap();
}

/// Names that pass the core's rules but that ZooKeeper refuses are rejected with
/// `InvalidName` before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_zookeeper_paths_are_rejected() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = unique_namespace("zk_invalid");
    let s = session(&f, &ns).await;
    for bad in ["a\u{e000}b", "x/\u{fff0}", "q/lock-0000000001"] {
        let m = s.mutex(bad).expect("the core accepts it");
        let r = m.lock().await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "{bad:?}: {r:?}"
        );
        // The failed attempt's cleanup holds the local queue until it is done.
        s.flush().await;
        let r = m.try_lock().await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "{bad:?}: {r:?}"
        );
        s.flush().await;
        let e = s.election(bad).unwrap();
        assert!(
            matches!(e.campaign(b"v").await, Err(Error::InvalidName { .. })),
            "{bad:?}"
        );
        assert!(
            matches!(e.leader().await, Err(Error::InvalidName { .. })),
            "{bad:?}"
        );
    }
    // The reserved /zookeeper subtree, with the empty namespace or as a namespace.
    let root = Session::builder(f.zookeeper().clone())
        .namespace("")
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    for bad in ["zookeeper", "zookeeper/quota"] {
        let r = root.mutex(bad).unwrap().try_lock().await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "{bad:?}: {r:?}"
        );
    }
    let reserved = Session::builder(f.zookeeper().clone())
        .namespace("/zookeeper/x")
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    let r = reserved.mutex("a").unwrap().try_lock().await;
    assert!(matches!(r, Err(Error::InvalidName { .. })), "{r:?}");
    assert!(matches!(
        reserved.list_entries().await,
        Err(Error::InvalidName { .. })
    ));
    // Not reserved below another node.
    let g = s.mutex("zookeeper").unwrap().lock().await.unwrap();
    assert_eq!(
        s.list_entries().await.unwrap(),
        vec![g.key().to_string()],
        "only that one"
    );
    g.release().await.unwrap();
    for x in [s, root, reserved] {
        x.close().await.unwrap();
    }
}

/// A chroot (builder or connect string) roots every path, is created if missing, and keys
/// are relative to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chroot_roots_every_path() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let root = format!("/{}", unique_namespace("zk_chroot").replace('/', "-"));
    let backend = ZooKeeperBackend::connect(&format!("{}{root}/app", f.server().connect_string()))
        .await
        .unwrap();
    assert_eq!(backend.chroot(), Some(format!("{root}/app").as_str()));
    let s = Session::builder(backend)
        .namespace("locks")
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    let g = s.mutex("zookeeper").unwrap().lock().await.unwrap();
    assert!(g.key().starts_with("/locks/zookeeper/_c_"), "{}", g.key());
    let zk = raw(&f).await;
    let (_, stat) = zk
        .get_data(&format!("{root}/app{}", g.key()))
        .await
        .unwrap();
    assert_eq!(g.token().get(), stat.czxid as u64);
    assert_eq!(s.list_entries().await.unwrap(), vec![g.key().to_string()]);
    g.release().await.unwrap();
    s.close().await.unwrap();

    let r = ZooKeeperBackend::builder(format!("{}{root}", f.server().connect_string()))
        .chroot("/elsewhere")
        .connect()
        .await;
    assert!(
        matches!(r, Err(Error::InvalidConfig(_))),
        "conflicting chroots: {r:?}"
    );
}

/// An unreachable cluster gives `Error::Connect` after the connect timeout, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_cluster_fails_to_connect() {
    if !harness::available() {
        return;
    }
    let timeout = Duration::from_millis(800);
    // Refused (nothing listens), and a black hole (packets dropped or unroutable).
    for endpoint in ["127.0.0.1:1", "10.255.255.1:2181"] {
        let start = Instant::now();
        let r = bounded(
            Duration::from_secs(10),
            "connect gives up",
            ZooKeeperBackend::builder(endpoint)
                .connect_timeout(timeout)
                .connect(),
        )
        .await;
        assert!(matches!(r, Err(Error::Connect { .. })), "{endpoint}: {r:?}");
        assert!(r.unwrap_err().is_temporary());
        assert!(
            start.elapsed() < timeout + Duration::from_secs(2),
            "{endpoint}: bounded"
        );
    }
}

/// A session sees the deletion of its own node and of the head, and `keep_alive` confirms a
/// live session; after `close` it reports the session lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_session_primitives() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = unique_namespace("zk_primitives");
    let a = f.zookeeper().session(TTL).await.unwrap();
    let b = Arc::new(f.zookeeper().session(TTL).await.unwrap());
    a.keep_alive().await.unwrap();
    let q = queue(&ns, "e", QueueKind::Election);
    assert!(a.head(&q).await.unwrap().is_none());
    // A change watcher on the empty (not yet existing) queue fires on the first entry.
    let b_watch = {
        let (b, q) = (b.clone(), q.clone());
        tokio::spawn(async move { b.wait_queue_change(&q, None).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!b_watch.is_finished());
    let (ea, head) = a
        .enqueue(
            &q,
            "11111111-2222-4333-8444-555566667777".parse().unwrap(),
            b"A",
        )
        .await
        .unwrap();
    assert!(head);
    bounded(WAIT, "queue change seen", b_watch)
        .await
        .unwrap()
        .unwrap();
    let seen = b.head(&q).await.unwrap().unwrap();
    assert_eq!(seen.0, ea);
    assert_eq!(seen.1, b"A");
    // A value change is a change.
    let w = {
        let (b, q, seen) = (b.clone(), q.clone(), seen.clone());
        tokio::spawn(async move { b.wait_queue_change(&q, Some(&seen)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!w.is_finished());
    assert!(a.set_value(&ea, b"A2").await.unwrap());
    bounded(WAIT, "value change seen", w)
        .await
        .unwrap()
        .unwrap();
    // An unchanged queue returns at once only if it differs.
    let seen = b.head(&q).await.unwrap().unwrap();
    assert_eq!(seen.1, b"A2");
    let stale = (seen.0.clone(), b"old".to_vec());
    bounded(
        Duration::from_secs(5),
        "differs at once",
        b.wait_queue_change(&q, Some(&stale)),
    )
    .await
    .unwrap();
    // b queues behind a and waits for a's entry to go.
    let (eb, head) = b
        .enqueue(
            &q,
            "21111111-2222-4333-8444-555566667777".parse().unwrap(),
            b"B",
        )
        .await
        .unwrap();
    assert!(!head);
    let pred = b
        .predecessor(&q, &eb)
        .await
        .unwrap()
        .expect("a is before b");
    assert_eq!(pred.key, ea.key);
    let gone = {
        let (b, pred) = (b.clone(), pred.clone());
        tokio::spawn(async move { b.wait_gone(&pred).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!gone.is_finished());
    assert!(a.remove(&ea).await.unwrap());
    bounded(WAIT, "predecessor gone", gone)
        .await
        .unwrap()
        .unwrap();
    assert!(
        b.predecessor(&q, &eb).await.unwrap().is_none(),
        "b heads the queue"
    );
    assert!(!a.set_value(&ea, b"late").await.unwrap(), "gone");
    assert!(matches!(
        a.predecessor(&q, &ea).await,
        Err(Error::EntryVanished { .. })
    ));
    a.close().await.unwrap();
    assert!(matches!(a.keep_alive().await, Err(Error::SessionLost(_))));
    assert!(matches!(a.head(&q).await, Err(Error::SessionLost(_))));
    assert_eq!(a.list(&ns).await.map_err(|_| ()), Err(()));
    assert_eq!(b.list(&ns).await.unwrap(), vec![eb.key.clone()]);
    b.close().await.unwrap();
}

/// The ZooKeeper client pings by itself; the session still ends one TTL after the last
/// `keep_alive`, as fencelock's heartbeat contract says (this is what makes a session whose
/// heartbeats stopped lose its entries), and lives on while `keep_alive` is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_ends_without_keep_alive() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = unique_namespace("zk_heartbeat");
    let ttl = Duration::from_secs(2);
    let silent = f.zookeeper().session(ttl).await.unwrap();
    let beating = f.zookeeper().session(ttl).await.unwrap();
    let q = queue(&ns, "h", QueueKind::Lock);
    let (es, _) = silent
        .enqueue(
            &q,
            "31111111-2222-4333-8444-555566667777".parse().unwrap(),
            b"",
        )
        .await
        .unwrap();
    let (eb, _) = beating
        .enqueue(
            &q,
            "41111111-2222-4333-8444-555566667777".parse().unwrap(),
            b"",
        )
        .await
        .unwrap();
    let zk = raw(&f).await;
    let start = Instant::now();
    while start.elapsed() < ttl * 2 {
        beating.keep_alive().await.unwrap();
        tokio::time::sleep(ttl / 4).await;
    }
    assert!(
        zk.check_stat(&es.key).await.unwrap().is_none(),
        "silent session ended"
    );
    assert!(matches!(
        silent.keep_alive().await,
        Err(Error::SessionLost(fencelock::LostReason::Expired))
    ));
    assert!(
        zk.check_stat(&eb.key).await.unwrap().is_some(),
        "beating session alive"
    );
    beating.close().await.unwrap();
    assert!(zk.check_stat(&eb.key).await.unwrap().is_none(), "closed");
}

/// Polls `cond` every 20 ms until it holds, failing after `limit`.
async fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A dropped connection makes the session suspended (ZooKeeper `Disconnected`); once the
/// client reconnects within the session timeout it is live again and still holds its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_suspends_and_reconnect_resumes() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let proxy = Proxy::start(&f.server().connect_string()).await;
    let backend = ZooKeeperBackend::connect(&proxy.addr()).await.unwrap();
    let ns = unique_namespace("zk_suspend");
    let s = Session::builder(backend)
        .namespace(&ns)
        .ttl(Duration::from_secs(8))
        .start()
        .await
        .unwrap();
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    proxy.set(Mode::Reset);
    until(Duration::from_secs(5), "suspended", || {
        s.state() == SessionState::Suspended
    })
    .await;
    assert!(
        g.is_held(),
        "suspended, not lost: the local deadline is ahead"
    );
    proxy.set(Mode::Pass);
    until(Duration::from_secs(5), "live again", || {
        s.state() == SessionState::Live
    })
    .await;
    assert!(g.is_held());
    let zk = raw(&f).await;
    let (_, stat) = zk.get_data(g.key()).await.unwrap();
    assert_eq!(
        format!("{:x}", stat.ephemeral_owner as u64),
        s.id(),
        "same session"
    );
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// A holder cut off from the cluster (nothing flows, no reset) steps down by its own clock
/// before the server expires its session and grants the lock to the next waiter, whose token
/// is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_holder_steps_down_before_successor() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let proxy = Proxy::start(&f.server().connect_string()).await;
    let backend = ZooKeeperBackend::builder(proxy.addr())
        .min_ttl(MIN_SESSION_TIMEOUT)
        .connect()
        .await
        .unwrap();
    let ns = unique_namespace("zk_cut_off");
    let ttl = Duration::from_secs(2);
    let a = Session::builder(backend)
        .namespace(&ns)
        .ttl(ttl)
        .start()
        .await
        .unwrap();
    let b = session(&f, &ns).await;
    let ga = a.mutex("m").unwrap().lock().await.unwrap();
    let a_lost = tokio::spawn({
        let lost = ga.lost();
        async move { (lost.await, Instant::now()) }
    });
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let g = b.mutex("m").unwrap().lock().await;
            (g.map(|g| g.token()), Instant::now())
        }
    });
    fencelock::conformance::wait_entries(&b, "b queued", |l| l.len() == 2).await;
    proxy.set(Mode::BlackHole);
    let (tb, b_at) = bounded(WAIT, "b granted", waiter).await.unwrap();
    let (reason, a_at) = bounded(WAIT, "a lost", a_lost).await.unwrap();
    assert!(
        a_at <= b_at,
        "a stepped down ({reason}) before b was granted"
    );
    assert!(tb.unwrap() > ga.token());
    assert!(!ga.is_held());
    b.close().await.unwrap();
    drop(proxy);
    let _ = bounded(WAIT, "a closes", a.close()).await;
}

/// The requests the server received on the connection of the session `sid` (hex, as
/// `Session::id`), from the `cons` four-letter word.
fn requests_received(f: &ZkFactory, sid: &str) -> u64 {
    let cons = f.server().four_letter("cons").expect("cons");
    let line = cons
        .lines()
        .find(|l| l.contains(&format!("sid=0x{sid},")) || l.contains(&format!("sid=0x{sid})")))
        .unwrap_or_else(|| panic!("no connection of session {sid} in:\n{cons}"));
    let recved = line.split("recved=").nth(1).expect("recved=");
    recved[..recved
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(recved.len())]
        .parse()
        .expect("recved count")
}

/// What an uncontended lock + release costs the server: three requests (the create, the
/// listing sent right behind it, the delete), whether the release comes at once or after the
/// guard's watch on its entry is in place (it rides on the listing: no request of its own, and
/// none to remove it). A regression here shows in the benchmark's latency and throughput.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_lock_costs_three_requests() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = unique_namespace("zk_requests");
    let s = session(&f, &ns).await;
    let m = s.mutex("m").unwrap();
    m.lock().await.unwrap().release().await.unwrap(); // parents created
    const ROUNDS: u64 = 20;
    let before = requests_received(&f, &s.id());
    for i in 0..ROUNDS {
        let g = m.lock().await.unwrap();
        if i % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(20)).await; // the guard watches
        }
        g.release().await.unwrap();
    }
    let spent = requests_received(&f, &s.id()) - before;
    // Slack for a keep-alive or two.
    assert!(
        spent <= 3 * ROUNDS + 2,
        "{spent} requests for {ROUNDS} lock + release"
    );
    // The guard's watch still sees its entry deleted by someone else.
    let g = m.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    raw(&f).await.delete(g.key(), None).await.unwrap();
    assert_eq!(
        bounded(WAIT, "lost on deletion", g.lost()).await,
        fencelock::LostReason::EntryDeleted
    );
    s.close().await.unwrap();
}

/// Interoperability with Apache Curator's `InterProcessMutex`, run in a JVM of its own (Debian's
/// `libcurator-recipes-java`; the program is `tests/java/CuratorMutex.java`, compiled at test
/// time): Curator and fencelock contend on the same queue `/{namespace}/{lock}`. Skipped with a
/// message when java, javac or the jars are missing (a failure in CI). By hand:
/// `scripts/curator-interop.sh`.
mod curator {
    use super::*;
    use fencelock::conformance::wait_entries;
    use fencelock::{Fence, FencingToken};
    use fencelock_integration::curator::{self as java, CuratorMutex, JavaClasses};

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
        let mut short =
            CuratorMutex::spawn(&classes, &connect, &path, Duration::from_secs(1), WAIT);
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
}
