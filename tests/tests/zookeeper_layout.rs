//! ZooKeeper layout: Curator's node names, the czxid token, foreign entries ordered with ours,
//! paths ZooKeeper refuses, and the chroot.

use std::time::{Duration, Instant};

use fencelock::conformance::{bounded, unique_namespace, TTL, WAIT};
use fencelock::{Error, Session};
use fencelock_integration::curator::assert_curator_name;
use fencelock_integration::servers::zookeeper::ZkFactory;
use fencelock_zookeeper::ZooKeeperBackend;
use zookeeper_client as zk;

async fn session(f: &ZkFactory, ns: &str) -> Session {
    Session::builder(f.zookeeper().clone())
        .namespace(ns)
        .ttl(TTL)
        .start()
        .await
        .expect("session")
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
    let zk = f.raw().await;

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
    let zk = f.raw().await;
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

/// Names that pass the core's rules but that ZooKeeper refuses (characters outside its path
/// alphabet, among them every character above U+FFFF, such as emoji; segments that look like
/// queue entries; the reserved `/zookeeper` subtree) are rejected with `InvalidName` by
/// `mutex()`, `election()` and `start()`, before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_zookeeper_paths_are_rejected() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = unique_namespace("zk_invalid");
    let s = session(&f, &ns).await;
    for bad in [
        "a\u{e000}b",
        "x/\u{fff0}",
        "q/lock-0000000001",
        "emoji-\u{1f512}",
        "cjk-ext-b-\u{20000}",
    ] {
        assert!(
            fencelock::validate_name(bad).is_ok(),
            "the core accepts {bad:?}"
        );
        let r = s.mutex(bad);
        assert!(matches!(r, Err(Error::InvalidName(_))), "{bad:?}: {r:?}");
        let r = s.election(bad);
        assert!(matches!(r, Err(Error::InvalidName(_))), "{bad:?}: {r:?}");
    }
    // Still fine: characters of the Basic Multilingual Plane.
    let g = s.mutex("é-中文").unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    // The reserved /zookeeper subtree, with the empty namespace or as a namespace.
    let root = Session::builder(f.zookeeper().clone())
        .namespace("")
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    for bad in ["zookeeper", "zookeeper/quota"] {
        let r = root.mutex(bad);
        assert!(matches!(r, Err(Error::InvalidName(_))), "{bad:?}: {r:?}");
    }
    for bad in ["/zookeeper/x", "ns/\u{1f512}"] {
        let r = Session::builder(f.zookeeper().clone())
            .namespace(bad)
            .ttl(TTL)
            .start()
            .await;
        assert!(matches!(r, Err(Error::InvalidName(_))), "{bad:?}: {r:?}");
    }
    // Not reserved below another node.
    let g = s.mutex("zookeeper").unwrap().lock().await.unwrap();
    assert_eq!(
        s.list_entries().await.unwrap(),
        vec![g.key().to_string()],
        "only that one"
    );
    g.release().await.unwrap();
    for x in [s, root] {
        x.close().await.unwrap();
    }
}

/// A chroot (builder or connect string) roots every path and keys are relative to it. A
/// missing chroot is an error (a typo must not create a new, empty lock area), unless
/// `create_chroot(true)` asks for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chroot_roots_every_path() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let root = format!("/{}", unique_namespace("zk_chroot").replace('/', "-"));
    let connect_string = format!("{}{root}/app", f.server().connect_string());
    let backend = ZooKeeperBackend::connect(&connect_string).await.unwrap();
    assert_eq!(backend.chroot(), Some(format!("{root}/app").as_str()));
    let r = Session::builder(backend).ttl(TTL).start().await;
    assert!(
        matches!(r, Err(Error::InvalidConfig(_))),
        "missing chroot: {r:?}"
    );
    assert!(
        f.raw().await.check_stat(&root).await.unwrap().is_none(),
        "nothing created"
    );
    let backend = ZooKeeperBackend::builder(connect_string)
        .create_chroot(true)
        .connect()
        .await
        .unwrap();
    let s = Session::builder(backend)
        .namespace("locks")
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    let g = s.mutex("zookeeper").unwrap().lock().await.unwrap();
    assert!(g.key().starts_with("/locks/zookeeper/_c_"), "{}", g.key());
    let zk = f.raw().await;
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

/// A listing of a namespace wider than the requests a listing keeps out at once (32) finds
/// every entry, at every depth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wide_namespace_is_listed_whole() {
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = unique_namespace("zk_wide");
    let s = session(&f, &ns).await;
    let mut guards = Vec::new();
    for i in 0..100 {
        let name = if i % 2 == 0 {
            format!("wide-{i}")
        } else {
            format!("deep/{i}/lock")
        };
        guards.push(
            bounded(WAIT, "a lock", s.mutex(&name).unwrap().lock())
                .await
                .unwrap(),
        );
    }
    let mut listed = bounded(WAIT, "the listing", s.list_entries())
        .await
        .unwrap();
    let mut held: Vec<String> = guards.iter().map(|g| g.key().to_string()).collect();
    listed.sort();
    held.sort();
    assert_eq!(listed, held);
    for g in guards {
        g.release().await.unwrap();
    }
    s.close().await.unwrap();
}
