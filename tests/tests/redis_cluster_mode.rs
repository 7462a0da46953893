//! Redis Cluster: the conformance suite and the cluster's own behaviour (locks spread over the
//! shards, one session across them, multi-locks across shards, a slot moved while its lock is
//! held, a primary failed over) against a real cluster of three primaries and three replicas
//! started by the harness.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use fencelock::{Error, Session, SessionState};
use fencelock_integration::servers::redis_cluster::{RedisCluster, RedisClusterFactory};
use fencelock_redis::{RedisBackend, RedisConfig};

fencelock::conformance_tests!(RedisClusterFactory::shared());

/// The cluster slot of the queue of lock `name` in namespace `ns` (its group's counter key).
fn slot_of(cluster: &RedisCluster, ns: &str, name: &str) -> u16 {
    // Any entry name of the queue has the queue's group.
    let prefix = fencelock_redis::layout::cluster_prefix(&format!("{ns}/{name}/x")).unwrap();
    cluster.slot_of(&format!("{prefix}:t"))
}

/// A cluster of its own (for a test that takes a node away), and a backend on it.
async fn own_cluster() -> Option<(RedisCluster, RedisBackend)> {
    if !fencelock_integration::servers::redis::available() {
        return None;
    }
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let backend = cluster.backend().await;
    Some((cluster, backend))
}

/// Waits (bounded) until the mutex `name` has a waiter.
async fn until_queued(s: &Session, name: &str) {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.mutex(name).unwrap().waiters().await.unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < until,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A session holds locks on every shard: each lock's keys are on the primary that serves its
/// group's slot, each lock's tokens grow, and the one session stays live across heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_spread_over_the_shards() {
    let Some(f) = RedisClusterFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("spread");
    let s = Session::builder(f.redis().clone())
        .namespace(ns.as_str())
        .ttl(Duration::from_secs(2))
        .start()
        .await
        .unwrap();
    let names: Vec<String> = (0..60).map(|i| format!("lock-{i}")).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(s.mutex(n).unwrap().lock().await.unwrap());
    }
    let mut per_primary: BTreeMap<usize, usize> = BTreeMap::new();
    for n in &names {
        let slot = slot_of(&f.cluster, &ns, n);
        *per_primary
            .entry(tokio::task::block_in_place(|| f.cluster.primary_of(slot)))
            .or_default() += 1;
    }
    assert_eq!(
        per_primary.len(),
        3,
        "60 locks on every primary: {per_primary:?}"
    );
    // Past two TTLs: the heartbeats (one script per group) keep every lock.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(s.state(), SessionState::Live);
    let listed: HashSet<String> = s
        .queues("")
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    for n in &names {
        assert!(listed.contains(n.as_str()), "{n} listed: {listed:?}");
    }
    for (g, name) in guards.into_iter().zip(&names) {
        assert!(g.is_held());
        let token = g.token();
        g.release().await.unwrap();
        let again = s.mutex(name).unwrap().lock().await.unwrap();
        assert!(again.token() > token, "{name}: tokens grow per lock");
        again.release().await.unwrap();
    }
    s.close().await.unwrap();
}

/// Two names in the same group and in different groups: a multi-lock's `try_lock` takes all or
/// nothing either way, and leaves no entry when refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_across_shards() {
    let Some(f) = RedisClusterFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("multi");
    let start = || {
        Session::builder(f.redis().clone())
            .namespace(ns.as_str())
            .start()
    };
    let (a, b) = (start().await.unwrap(), start().await.unwrap());
    // Names on different primaries.
    let names: Vec<String> = (0..40).map(|i| format!("acct-{i}")).collect();
    let primary =
        |n: &str| tokio::task::block_in_place(|| f.cluster.primary_of(slot_of(&f.cluster, &ns, n)));
    let x = &names[0];
    let y = names
        .iter()
        .find(|n| primary(n) != primary(x))
        .expect("a name on another primary");
    let z = names
        .iter()
        .find(|n| *n != x && *n != y && primary(n) != primary(x) && primary(n) != primary(y))
        .expect("a name on the third primary");
    let held = b.mutex(z).unwrap().lock().await.unwrap();
    let set = a.multi_lock([x.as_str(), y.as_str(), z.as_str()]).unwrap();
    assert!(set.try_lock().await.unwrap().is_none(), "{z} is taken");
    for n in [x, y] {
        let m = a.mutex(n).unwrap();
        assert!(
            m.holder().await.unwrap().is_none() && m.waiters().await.unwrap().is_empty(),
            "{n}: nothing left by the refused set"
        );
    }
    held.release().await.unwrap();
    let got = set.try_lock().await.unwrap().expect("all free");
    assert_eq!(got.tokens().len(), 3);
    assert!(b.mutex(y).unwrap().try_lock().await.unwrap().is_none());
    got.release().await.unwrap();
    // The ordered `lock` across shards.
    let got = set.lock().await.unwrap();
    got.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The slot of a held lock moves to another primary (`MIGRATING`/`IMPORTING`, the keys moved
/// with `MIGRATE`) while a waiter waits: the holder keeps it across heartbeats, its release
/// reaches the waiter, whose token is larger, and new locks of that group work on the new node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_moves_while_its_lock_is_held() {
    slot_moves_while_held(Duration::from_millis(300)).await;
}

/// The same with the slot half moved for two TTLs (a slot with many keys, moved in batches):
/// the sessions' heartbeats, whose scripts stop there until the move ends, renew their keys
/// alone meanwhile. Both sessions were lost at their deadline (black-box round 35).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_half_moved_for_two_ttls_loses_no_session() {
    slot_moves_while_held(Duration::from_secs(6)).await;
}

/// A lock held and waited for while its slot moves, half moved for `half_moved` (TTL 3 s).
async fn slot_moves_while_held(half_moved: Duration) {
    let Some(f) = RedisClusterFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("reshard");
    let start = || {
        Session::builder(f.redis().clone())
            .namespace(ns.as_str())
            .ttl(Duration::from_secs(3))
            .start()
    };
    let (a, b) = (start().await.unwrap(), start().await.unwrap());
    let held = a.mutex("moving").unwrap().lock().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.mutex("moving").unwrap().lock().await })
    };
    // The waiter is queued before the move.
    until_queued(&a, "moving").await;
    let slot = slot_of(&f.cluster, &ns, "moving");
    let cluster = f.cluster.clone();
    let session = a.clone();
    let rt = tokio::runtime::Handle::current();
    let during = tokio::task::spawn_blocking(move || {
        let mut during = None;
        let to = cluster.move_slot(slot, || {
            // Half moved: a read of the slot's queue fails with TRYAGAIN, retried until the
            // slot has moved (a half-moved queue is never read).
            let m = session.mutex("moving").unwrap();
            during = Some(rt.spawn(async move { m.waiters().await }));
            std::thread::sleep(half_moved);
        });
        assert_eq!(cluster.primary_of(slot), to);
        during.expect("moved in two batches at least")
    })
    .await
    .unwrap();
    let waiters = tokio::time::timeout(Duration::from_secs(10), during)
        .await
        .expect("the read during the move ends once it moved")
        .unwrap();
    match waiters {
        Ok(waiters) => assert_eq!(waiters.len(), 1, "the waiter, read whole: {waiters:?}"),
        // A read gives up after a TTL of tries (a temporary error).
        Err(e) if half_moved > Duration::from_secs(3) && e.is_temporary() => {}
        Err(e) => panic!("the read during the move: {e:?}"),
    }
    assert_eq!(a.state(), SessionState::Live, "lost while the slot moved");
    assert_eq!(b.state(), SessionState::Live, "lost while the slot moved");
    // Heartbeats after the move (TTL 3 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(a.state(), SessionState::Live);
    assert!(held.is_held());
    assert!(!waiter.is_finished(), "granted while held");
    let token = held.token();
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is granted after the release")
        .unwrap()
        .unwrap();
    assert!(got.token() > token);
    got.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Wrong settings are typed errors, within the timeout, the password never shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_settings() {
    for bad in [
        "redis+cluster://",
        "redis+cluster://127.0.0.1:0",
        "redis+cluster://127.0.0.1:1/2",
        "redis+cluster://u:s3cret@127.0.0.1:1,,",
    ] {
        let r = RedisBackend::connect(bad).await;
        match r {
            Err(Error::InvalidConfig(e)) => assert!(!e.to_string().contains("s3cret"), "{e}"),
            r => panic!("{bad}: {r:?}"),
        }
    }
    let r = RedisConfig::new("redis+cluster://127.0.0.1:1")
        .wait_for_replicas(1, Duration::from_millis(100))
        .connect()
        .await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    let port = fencelock_integration::free_port();
    let started = std::time::Instant::now();
    let r = RedisConfig::new(format!("redis+cluster://u:s3cret@127.0.0.1:{port}"))
        .timeout(Duration::from_millis(500))
        .connect()
        .await;
    match r {
        Err(
            e @ Error::Connect {
                temporary: true, ..
            },
        ) => assert!(!format!("{e} {e:?}").contains("s3cret"), "{e:?}"),
        r => panic!("nothing listening: {r:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));

    // A cluster URL to a server without cluster mode, and a server URL to a cluster's node.
    let Some(f) = RedisClusterFactory::shared().await else {
        return;
    };
    let server = tokio::task::spawn_blocking(fencelock_integration::servers::redis::shared)
        .await
        .unwrap()
        .expect("redis");
    // A standalone server first in a cluster URL whose next node is the cluster's: the
    // cluster connects through the next node, and the server took the pub/sub connections
    // (every handoff waited for a re-check: black-box round 20).
    let mixed = format!(
        "redis+cluster://{},{}",
        server.addr(),
        f.cluster.node(0).addr()
    );
    for (url, why) in [
        (format!("redis+cluster://{}", server.addr()), "not a node"),
        (format!("redis://{}", f.cluster.node(0).addr()), "a node"),
        (mixed, "a standalone server first"),
    ] {
        let r = RedisBackend::connect(&url).await;
        match r {
            Err(Error::InvalidConfig(e)) => println!("{url}: {e}"),
            r => panic!("{url} ({why}): {r:?}"),
        }
    }
}

/// A primary killed: its replica takes over, the sessions stay live (the replica had their
/// keys: the lock was taken well before; heartbeats reach it), the holder keeps its lock, and
/// a waiter is granted after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_fails_over() {
    primary_fails_over(false).await;
}

/// A primary hung (paused, as a suspended host: its connections stay open and nothing is
/// answered), not killed: its replica takes over, and the sessions follow it there although
/// the hung node never refuses a request. The cluster client retries a request that timed out
/// on the same node, and learns the new slot map only from a refusal or a redirect, which a
/// hung node never sends: the holder was lost at its deadline, 4-8 s after the promotion, at
/// TTL 10 s and 20 s (black-box round 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_primary_fails_over() {
    primary_fails_over(true).await;
}

/// The primary of a held lock's shard killed, or paused (`hung`) until the end: for two TTLs
/// the sessions stay live on the promoted replica, the holder keeps its lock, and the waiter
/// is granted after the release, with a larger token.
async fn primary_fails_over(hung: bool) {
    let Some((cluster, backend)) = own_cluster().await else {
        return;
    };
    let ttl = Duration::from_secs(if hung { 10 } else { 8 });
    let start = || {
        Session::builder(backend.clone())
            .namespace("failover")
            .ttl(ttl)
            .start()
    };
    let (a, b) = (start().await.unwrap(), start().await.unwrap());
    let held = a.mutex("jobs").unwrap().lock().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.mutex("jobs").unwrap().lock().await })
    };
    until_queued(&a, "jobs").await;
    let primary = cluster.primary_of(slot_of(&cluster, "failover", "jobs"));
    tokio::task::block_in_place(|| {
        use fencelock_integration::servers::Cluster;
        // Replicated before the fault: the waiter's entry and both sessions' keys (what a
        // failover may lose without `wait_for_replicas`, by design, is not this test's point).
        // A heartbeat that extends a key between this and the fault may be lost: the key's
        // earlier expiry, replicated, outlasts the failover by far.
        cluster.wait_replicated(primary);
        match hung {
            true => cluster.pause(primary),
            false => cluster.kill(primary),
        }
    });
    // Two TTLs after the fault: heartbeats reach the promoted replica, which has the
    // session's key (replicated well before the fault).
    tokio::time::sleep(ttl * 2).await;
    let states = (a.state(), b.state());
    if hung {
        tokio::task::block_in_place(|| {
            use fencelock_integration::servers::Cluster;
            cluster.resume(primary);
        });
    }
    assert_eq!(states, (SessionState::Live, SessionState::Live));
    if waiter.is_finished() {
        panic!(
            "the waiter ended while the lock is held: {:?}",
            waiter.await
        );
    }
    assert!(held.is_held());
    let token = held.token();
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter is granted")
        .unwrap()
        .unwrap();
    assert!(got.token() > token);
    got.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A session depends on the shards of its locks alone: another shard's primary hung (paused)
/// loses neither a session holding a lock elsewhere nor one holding nothing (whose heartbeat,
/// a `PING` to a primary at random, was held up by the hung node: it was lost at TTL 2 s in
/// most runs and at 6 s in one run of two; a session holding nothing on a cluster now sends no
/// heartbeat), and a new backend connects meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_shard_hung() {
    let Some((cluster, backend)) = own_cluster().await else {
        return;
    };
    let start = || {
        Session::builder(backend.clone())
            .namespace("elsewhere")
            .ttl(Duration::from_secs(4))
            .start()
    };
    let (holder, idle) = (start().await.unwrap(), start().await.unwrap());
    let held = holder.mutex("jobs").unwrap().lock().await.unwrap();
    let ours = cluster.primary_of(slot_of(&cluster, "elsewhere", "jobs"));
    let other = cluster
        .primaries()
        .into_iter()
        .find(|p| *p != ours)
        .unwrap();
    tokio::task::block_in_place(|| {
        use fencelock_integration::servers::Cluster;
        cluster.pause(other);
    });
    // A new backend connects meanwhile, and locks on the healthy shard.
    let again = tokio::time::timeout(
        Duration::from_secs(10),
        RedisBackend::connect(cluster.url()),
    )
    .await
    .expect("the connect hung")
    .unwrap_or_else(|e| panic!("no connect while a shard is down: {e}"));
    let s = Session::builder(again)
        .namespace("elsewhere")
        .start()
        .await
        .unwrap();
    let other_lock = s.mutex("others").unwrap();
    if cluster.primary_of(slot_of(&cluster, "elsewhere", "others")) == ours {
        let g = other_lock.lock().await.unwrap();
        g.release().await.unwrap();
    }
    s.close().await.unwrap();
    // Neither lost, for longer than the TTL (a heartbeat held up by the hung node may leave
    // the holder Suspended for a while), and the holder Live again.
    for _ in 0..50 {
        for (who, s) in [("holder", &holder), ("idle", &idle)] {
            assert!(
                !matches!(s.state(), SessionState::Lost(_)),
                "{who}: {:?}",
                s.state()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held.is_held());
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while holder.state() != SessionState::Live {
        assert!(tokio::time::Instant::now() < until, "{:?}", holder.state());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "a session holding nothing, a shard's primary hung: {:?}",
        idle.state()
    );
    held.release().await.unwrap();
    holder.close().await.unwrap();
    idle.close().await.unwrap();
}

/// A shard with neither its primary nor a replica up: a listing fails (temporary) rather than
/// list the other shards as the whole (`fencelock list` printed nothing, exit 0, while a lock
/// was held on that shard: black-box round 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_does_not_leave_out_a_shard_that_is_down() {
    let Some((cluster, backend)) = own_cluster().await else {
        return;
    };
    let session = |ttl| {
        Session::builder(backend.clone())
            .namespace("down")
            .ttl(Duration::from_secs(ttl))
            .start()
    };
    let s = session(30).await.unwrap();
    // A session holding nothing (no heartbeat on a cluster), whose reads give up after its TTL.
    let lister = session(10).await.unwrap();
    let held = s.mutex("held").unwrap().lock().await.unwrap();
    let names = |q: Vec<fencelock::QueueInfo>| q.into_iter().map(|q| q.name).collect::<Vec<_>>();
    assert_eq!(names(lister.queues("").await.unwrap()), ["held"]);
    let primary = cluster.primary_of(slot_of(&cluster, "down", "held"));
    let shard: Vec<usize> = std::iter::once(primary)
        .chain(cluster.replicas_of(primary))
        .collect();
    assert!(shard.len() > 1, "no replica of node {primary}");
    let id = cluster.id_of(primary);
    tokio::task::block_in_place(|| {
        use fencelock_integration::servers::Cluster;
        for &i in &shard {
            cluster.pause(i);
        }
        // Until the others mark the primary failed (a second without answers, then agreed):
        // a listing that asked it meanwhile only timed out.
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while !cluster.marked_failed(&id) {
            assert!(
                std::time::Instant::now() < until,
                "node {primary} never marked failed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let listed = tokio::time::timeout(Duration::from_secs(30), lister.queues(""))
        .await
        .expect("the listing hung");
    match listed {
        Err(e) => assert!(e.is_temporary(), "{e:?}"),
        Ok(q) => panic!("listed without the shard that is down: {:?}", names(q)),
    }
    tokio::task::block_in_place(|| {
        use fencelock_integration::servers::Cluster;
        for &i in &shard {
            cluster.resume(i);
        }
    });
    drop(held);
}

/// A TLS-only cluster (client port, cluster bus and replication) with an ACL user: locks on
/// every shard over `rediss+cluster://`; a wrong setting is a permanent, typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls() {
    use fencelock_integration::pki::TestPki;
    use fencelock_redis::TlsConfig;
    if !fencelock_integration::servers::redis::available() {
        return;
    }
    let pki = TestPki::generate();
    let cluster = tokio::task::block_in_place(|| RedisCluster::start_tls(&pki));
    let url = cluster.url();
    let backend = RedisConfig::new(&url)
        .tls(pki.client_tls())
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let s = Session::builder(backend)
        .namespace("tls")
        .start()
        .await
        .unwrap();
    let mut primaries = HashSet::new();
    for i in 0..30 {
        let name = format!("lock-{i}");
        primaries.insert(cluster.primary_of(slot_of(&cluster, "tls", &name)));
        let g = s.mutex(&name).unwrap().lock().await.unwrap();
        g.release().await.unwrap();
    }
    assert_eq!(primaries.len(), 3, "every shard used");
    s.close().await.unwrap();

    let plain = url.replacen("rediss+cluster://", "redis+cluster://", 1);
    let cases: Vec<(&str, RedisConfig)> = vec![
        ("plaintext to TLS nodes", RedisConfig::new(&plain)),
        (
            "a foreign CA",
            RedisConfig::new(&url).tls(TlsConfig::from_ca_file(pki.rogue_ca()).unwrap()),
        ),
        (
            "a wrong password",
            RedisConfig::new(url.replacen("app-pw", "nope", 1)).tls(pki.client_tls()),
        ),
    ];
    for (what, config) in cases {
        let started = std::time::Instant::now();
        let r = config.timeout(Duration::from_secs(2)).connect().await;
        let e = r.expect_err(what);
        assert!(!e.is_temporary(), "{what}: {e:?}");
        assert!(!format!("{e} {e:?}").contains("app-pw"), "{what}: {e:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{what}");
        println!("{what}: {e}");
    }
}

/// A guarded write on a cluster: with a key in the lock's slot (`colocated_key`), applied
/// while the lock is held and refused once it is released; a key in another slot is refused
/// as invalid (typed, permanent), nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_set_on_a_cluster() {
    let Some(f) = RedisClusterFactory::shared().await else {
        return;
    };
    let backend = f.redis().clone();
    let ns = fencelock::conformance::unique_namespace("guarded");
    let s = Session::builder(backend.clone())
        .namespace(ns.as_str())
        .ttl(Duration::from_secs(5))
        .start()
        .await
        .unwrap();
    let mut con = backend.connection();
    let get = |key: String| {
        let mut con = backend.connection();
        async move {
            redis::cmd("GET")
                .arg(&key)
                .query_async::<Option<String>>(&mut con)
                .await
                .unwrap()
        }
    };
    let g = s.mutex("res").unwrap().lock().await.unwrap();
    let key = backend.colocated_key(&g, &format!("app/{ns}/value"));
    assert!(key.starts_with('{'), "{key}");
    assert_eq!(backend.colocated_key(&g, &key), key, "tagged once");
    let written = fencelock_redis::guarded_set(&mut con, &g, &key, b"one").await;
    assert!(written.unwrap(), "held: written");
    assert_eq!(get(key.clone()).await.as_deref(), Some("one"));

    // A key in another slot than the entry's: typed, nothing written.
    let plain = format!("app/{ns}/plain");
    match fencelock_redis::guarded_set(&mut con, &g, &plain, b"x").await {
        Err(Error::InvalidName(e)) => println!("{e}"),
        r => panic!("a key in another slot: {r:?}"),
    }
    assert_eq!(get(plain).await, None);

    assert!(fencelock_redis::guarded_set(&mut con, &g, &key, b"two")
        .await
        .unwrap());
    g.release().await.unwrap();
    let after = fencelock_redis::guarded_set(&mut con, &g, &key, b"three").await;
    assert!(!after.unwrap(), "released: refused");
    assert_eq!(get(key).await.as_deref(), Some("two"));
    s.close().await.unwrap();
}

/// A session that locks again in a group it has let go of (its last lock there released, so the
/// heartbeat stopped renewing its key there) renews its key there. The key kept the expiry of
/// its last renewal, and the next heartbeat found it gone: the whole session was lost (and its
/// new entry was dead to other sessions meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locking_again_in_a_group_let_go_renews_the_sessions_key() {
    let Some(f) = RedisClusterFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("again");
    let s = Session::builder(f.redis().clone())
        .namespace(ns.as_str())
        .ttl(Duration::from_secs(3))
        .start()
        .await
        .unwrap();
    let m = s.mutex("m").unwrap();
    m.lock().await.unwrap().release().await.unwrap();
    // Past a heartbeat or two (one a second): the group is let go, its key left with at most
    // a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let g = m.lock().await.unwrap();
    let prefix = fencelock_redis::layout::cluster_prefix(g.key()).unwrap();
    let key = format!("{prefix}:s:{}", s.id());
    let pttl: i64 = tokio::task::block_in_place(|| {
        let node = f.cluster.primary_of(f.cluster.slot_of(&key));
        f.cluster.node(node).cli(&["PTTL", &key])
    })
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    assert!(pttl > 2000, "the session's key there has {pttl} ms left");
    // Past the key's old expiry and the next heartbeats.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(s.state(), SessionState::Live);
    assert!(g.is_held());
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// A release that a failover undid, in a group the session has let go of, holds the lock up
/// for nobody, however the session's key there fared: the session's next lock in that group
/// finds the leftover out. (A code review's MEDIUM: with the key expired, the new key made the
/// leftover live again for its 60 TTLs; with the key brought back too, the session's
/// heartbeats renewed it for the session's life.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_undone_with_the_sessions_key_frees_the_lock() {
    release_undone_in_a_group_let_go(false, false).await;
}

/// As [`a_release_undone_with_the_sessions_key_frees_the_lock`], where the session's key
/// expired before the session locked there again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_undone_after_the_sessions_key_expired_frees_the_lock() {
    release_undone_in_a_group_let_go(true, false).await;
}

/// As [`a_release_undone_after_the_sessions_key_expired_frees_the_lock`], where the session
/// locks the same mutex again: its entry's name is the leftover's, and the lock is a new grant
/// (a new token, behind every waiter), not the leftover back with its token (as before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_undone_then_locked_again_is_a_new_grant() {
    release_undone_in_a_group_let_go(true, true).await;
}

/// As [`a_release_undone_then_locked_again_is_a_new_grant`], with the session's key back too,
/// listing the leftover: the server is behind the session's version there, and the lock is a
/// new grant (a review: it was the leftover back, beside whoever the release had granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_undone_with_the_sessions_key_then_locked_again_is_a_new_grant() {
    release_undone_in_a_group_let_go(false, true).await;
}

/// Two sessions in namespace `ns` of the shared cluster, at `ttl`.
async fn two_sessions(f: &RedisClusterFactory, ns: &str, ttl: Duration) -> (Session, Session) {
    let start = || {
        Session::builder(f.redis().clone())
            .namespace(ns)
            .ttl(ttl)
            .start()
    };
    (start().await.unwrap(), start().await.unwrap())
}

/// Names (`n0`, `n1`, …) whose queues in namespace `ns` are in the group of key prefix
/// `prefix` (`fencelock{G}`).
fn in_group<'a>(ns: &'a str, prefix: &'a str) -> impl Iterator<Item = String> + 'a {
    (0..100_000).map(|i| format!("n{i}")).filter(move |n| {
        fencelock_redis::layout::cluster_prefix(&format!("{ns}/{n}/x")).as_deref() == Some(prefix)
    })
}

/// A held entry's keys on the cluster, and what its hash and queue member held: enough to
/// write them back after its release, as a failover that lost the release leaves them.
struct Leftover<'a> {
    f: &'a RedisClusterFactory,
    node: usize,
    name: String,
    prefix: String,
    ekey: String,
    skey: String,
    qkey: String,
    fields: Vec<String>,
    score: String,
}

impl<'a> Leftover<'a> {
    /// The entry named `name` of session `sid`, read while held.
    fn read(f: &'a RedisClusterFactory, name: &str, sid: &str) -> Self {
        let prefix = fencelock_redis::layout::cluster_prefix(name).unwrap();
        let ekey = format!("{prefix}:e:{name}");
        let mut l = Leftover {
            f,
            node: f.cluster.primary_of(f.cluster.slot_of(&ekey)),
            name: name.to_string(),
            skey: format!("{prefix}:s:{sid}"),
            qkey: format!("{prefix}:q:{}", name.rsplit_once('/').unwrap().0),
            prefix,
            ekey,
            fields: Vec::new(),
            score: String::new(),
        };
        l.fields = l
            .cli(&["HGETALL", &l.ekey])
            .lines()
            .map(str::to_string)
            .collect();
        // A mutex entry's value, the last field, is empty: its line was trimmed.
        if l.fields.len() % 2 == 1 {
            l.fields.push(String::new());
        }
        assert!(l.fields.len() >= 8, "the entry's hash: {:?}", l.fields);
        l.score = l.cli(&["ZSCORE", &l.qkey, name]);
        assert!(!l.score.is_empty());
        l
    }

    /// `redis-cli` on the entry's primary, its output trimmed.
    fn cli(&self, args: &[&str]) -> String {
        tokio::task::block_in_place(|| self.f.cluster.node(self.node).cli(args))
            .unwrap()
            .trim()
            .to_string()
    }

    /// The entry's hash and its queue member back (not its session key's field).
    fn write_back(&self) {
        let mut hset = vec!["HSET", self.ekey.as_str()];
        hset.extend(self.fields.iter().map(String::as_str));
        assert_eq!(self.cli(&hset), (self.fields.len() / 2).to_string());
        self.cli(&["PEXPIRE", &self.ekey, "120000"]);
        self.cli(&["ZADD", &self.qkey, &self.score, &self.name]);
        self.cli(&["PEXPIRE", &self.qkey, "120000"]);
    }
}

/// A session holds `m` and releases it; then what a failover to a replica that missed the
/// release would leave is written back (the entry and its queue member; unless `key_expired`,
/// the session's key with the entry in it, at its version before the release too). Once the
/// session has let the group go, it locks another name there (`m` itself if `same_lock`, and
/// releases it). Another session must be granted `m` within a few TTLs.
async fn release_undone_in_a_group_let_go(key_expired: bool, same_lock: bool) {
    let Some(f) = RedisClusterFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("undone");
    let ttl = Duration::from_secs(2);
    let (s, other) = two_sessions(&f, &ns, ttl).await;
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    let token = g.token();
    let l = Leftover::read(&f, g.key(), &s.id());
    let version = l.cli(&["HGET", &l.skey, "v"]);
    assert!(!version.is_empty());
    // Another name whose queue is in the same group.
    let again = in_group(&ns, &l.prefix).next().unwrap();
    g.release().await.unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    if key_expired {
        // Let go: the heartbeat no longer renews the key there.
        while l.cli(&["EXISTS", &l.skey]) != "0" {
            assert!(tokio::time::Instant::now() < until, "the key never expired");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        l.write_back();
    } else {
        l.write_back();
        l.cli(&["HSET", &l.skey, "v", &version, &l.name, "1"]);
        // Longer than the TTL, which a heartbeat renewing it would set: let go once no beat
        // renewed it for more than two of their periods (a third of the TTL each), with
        // seconds left for the next lock.
        l.cli(&["PEXPIRE", &l.skey, "6000"]);
        loop {
            let left: i64 = l.cli(&["PTTL", &l.skey]).parse().unwrap();
            assert!(
                left > 2_000,
                "the key was renewed: the group was not let go"
            );
            if left < 4_600 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < until,
                "the key never ran down"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let relock = if same_lock { "m".to_string() } else { again };
    let held = s.mutex(&relock).unwrap().lock().await.unwrap();
    if same_lock {
        assert!(held.token() > token, "the leftover's token again");
        held.release().await.unwrap();
    }
    let granted = other
        .mutex("m")
        .unwrap()
        .lock_timeout(ttl * 4)
        .await
        .expect("the leftover entry held the lock up");
    assert_eq!(
        l.cli(&["EXISTS", &l.ekey]),
        "0",
        "the leftover entry is gone"
    );
    assert_eq!(s.state(), SessionState::Live);
    granted.release().await.unwrap();
    if !same_lock {
        assert!(held.is_held());
        held.release().await.unwrap();
    }
    s.close().await.unwrap();
    other.close().await.unwrap();
}

/// A multi-lock's `try_lock` (one script, its locks in one group) that finds at a queue's head
/// a leftover of its own session (a release a failover undid, which the session's key there no
/// longer lists) with a live waiter behind it does not take the lock: the leftover is dead, so
/// the waiter heads the queue. (A review of the fix above: taking the leftover's name for a
/// retry of its own, the script placed a new entry behind the waiter and reported the lock
/// taken, while dropping the leftover granted it to the waiter too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_does_not_take_a_leftover_a_waiter_waits_behind() {
    let Some(f) = RedisClusterFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("leftover_multi");
    let (s, other) = two_sessions(&f, &ns, Duration::from_secs(2)).await;
    let prefix = fencelock_redis::layout::cluster_prefix(&format!("{ns}/m/x")).unwrap();
    // Two more names whose queues are in the same group: one held throughout (the group stays
    // the session's), one for the multi-lock.
    let mut same = in_group(&ns, &prefix);
    let (kept, beside) = (same.next().unwrap(), same.next().unwrap());
    let kept = s.mutex(&kept).unwrap().lock().await.unwrap();
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    let l = Leftover::read(&f, g.key(), &s.id());
    g.release().await.unwrap();
    // The released entry back, live (listed by the session's key), as a failover that lost
    // the release leaves it; a waiter queues behind it.
    l.write_back();
    l.cli(&["HSET", &l.skey, &l.name, "1"]);
    let waiter = {
        let m = other.mutex("m").unwrap();
        tokio::spawn(async move { m.lock_timeout(Duration::from_secs(20)).await })
    };
    until_queued(&s, "m").await;
    // Then no longer listed, as a key made again after a lost release leaves it.
    assert_eq!(l.cli(&["HDEL", &l.skey, &l.name]), "1");
    let set = s.multi_lock(["m", beside.as_str()]).unwrap();
    let taken = set.try_lock().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was never granted")
        .unwrap()
        .expect("the waiter's lock");
    assert!(
        taken.is_none(),
        "the multi-lock took `m` beside the waiter's grant"
    );
    granted.release().await.unwrap();
    kept.release().await.unwrap();
    s.close().await.unwrap();
    other.close().await.unwrap();
}
