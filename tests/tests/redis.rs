//! The conformance suite and Redis-specific behaviour against a real `redis-server` started by
//! the harness.

use std::time::Duration;

use fencelock::{Error, Session};
use fencelock_integration::servers::redis::RedisFactory;
use fencelock_redis::{RedisBackend, RedisConfig};

fencelock::conformance_tests!(RedisFactory::shared());

/// A server of its own (no persistence), set up by `commands` (each the words of a
/// `redis-cli` command, answering `OK`); `None` where redis-server is missing.
async fn server_with(
    commands: &'static [&'static str],
) -> Option<fencelock_integration::servers::redis::RedisServer> {
    use fencelock_integration::servers::redis::{self as harness, Durability, RedisServer};
    if !harness::available() {
        return None;
    }
    let server = tokio::task::spawn_blocking(move || {
        let s = RedisServer::start(Durability::None);
        for command in commands {
            let words: Vec<&str> = command.split_whitespace().collect();
            assert_eq!(s.cli(&words).unwrap().trim(), "OK", "{command}");
        }
        s
    })
    .await
    .unwrap();
    Some(server)
}

/// Entries follow the etcd layout's names; the token is the token counter, and the entry
/// lives in the queue's sorted set with the token as its score.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_and_counter_token() {
    let Some(f) = RedisFactory::shared().await else {
        return;
    };
    let s = Session::builder(f.redis().clone())
        .namespace("layout")
        .start()
        .await
        .unwrap();
    let g = s.mutex("jobs/reindex").unwrap().lock().await.unwrap();
    assert_eq!(g.key(), format!("layout/jobs/reindex/{}", s.id()));
    let mut con = f.redis().connection();
    let score: f64 = redis::cmd("ZSCORE")
        .arg("fencelock:q:layout/jobs/reindex")
        .arg(g.key())
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(score as u64, g.token().get());
    let counter: u64 = redis::cmd("GET")
        .arg("fencelock:t")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(counter >= g.token().get());
    let pttl: i64 = redis::cmd("PTTL")
        .arg(format!("fencelock:s:{}", s.id()))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(pttl > 0, "the session key has a TTL: {pttl}");
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// An unreachable server fails with a temporary `Error::Connect` within the timeout; bad
/// settings are configuration errors.
#[tokio::test]
async fn unreachable_and_bad_settings() {
    let port = fencelock_integration::free_port();
    let start = std::time::Instant::now();
    let r = RedisConfig::new(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_millis(500))
        .connect()
        .await;
    assert!(
        matches!(
            r,
            Err(Error::Connect {
                temporary: true,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    for bad in [
        "redis://[::1",
        "http://x",
        "redis://127.0.0.1:0",
        "127.0.0.1:0",
        "redis://u:p@127.0.0.1:0/1",
        // A user without a password: redis-rs would log in as the default user, silently.
        "redis://app@127.0.0.1:1",
        "redis://app:@127.0.0.1:1",
        "redis+sentinel://app@127.0.0.1:1/primary",
        "redis+cluster://app@127.0.0.1:1",
        // redis-rs would ignore the database, read RESP3, or check no certificate.
        "redis://127.0.0.1:1?db=1",
        "127.0.0.1:1?db=1",
        "redis://u:p@127.0.0.1:1/2?protocol=resp3",
        "rediss://127.0.0.1:1#insecure",
        "redis+sentinel://127.0.0.1:1/primary?db=2",
        "redis+cluster://127.0.0.1:1?x=1",
    ] {
        let r = RedisBackend::connect(bad).await;
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{bad}: {r:?}");
    }
    // A Unix socket's URL carries its password in the query: masked in errors and `Debug`.
    let unix = "redis+unix:///nonexistent/fencelock.sock?pass=s3cret";
    let r = RedisConfig::new(unix)
        .timeout(Duration::from_millis(500))
        .connect()
        .await;
    let shown = format!(
        "{} {:?} {:?}",
        r.as_ref().unwrap_err(),
        r.as_ref().unwrap_err(),
        RedisConfig::new(unix)
    );
    assert!(!shown.contains("s3cret"), "{shown}");
    // A "port" hidden as a possible password is said to be (black-box round 39).
    let r = RedisBackend::connect("redis://127.0.0.1:99999").await;
    assert!(
        r.as_ref()
            .is_err_and(|e| e.to_string().contains("not a port")),
        "{r:?}"
    );
    let r = RedisConfig::new("127.0.0.1:1")
        .timeout(Duration::MAX)
        .connect()
        .await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    // A replica wait under the request timeout's least is fine (Redis's `WAIT` counts ms):
    // only the connect fails here.
    let r = RedisConfig::new("127.0.0.1:1")
        .timeout(fencelock_redis::MIN_TIMEOUT)
        .wait_for_replicas(1, Duration::from_millis(5))
        .connect()
        .await;
    assert!(matches!(r, Err(Error::Connect { .. })), "{r:?}");
    // 1 ns failed every connect later, as a temporary error (black-box round 39).
    let r = RedisConfig::new("127.0.0.1:1")
        .timeout(Duration::from_nanos(1))
        .connect()
        .await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    let r = RedisConfig::new("127.0.0.1:1")
        .wait_for_replicas(0, Duration::from_secs(1))
        .connect()
        .await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
}

/// Two namespaces can name the same queue (`/svc` + `x` and the empty namespace + `svc/x`, as
/// on etcd): one lock, one order, tokens that keep growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_namespaces_share_one_order() {
    let Some(f) = RedisFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("overlap");
    let a = Session::builder(f.redis().clone())
        .namespace(format!("{ns}/svc"))
        .start()
        .await
        .unwrap();
    let b = Session::builder(f.redis().clone())
        .namespace(ns.clone())
        .start()
        .await
        .unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let ga = a.mutex("x").unwrap().lock().await.unwrap();
        assert!(b
            .mutex("svc/x")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none());
        assert!(ga.token().get() > last);
        last = ga.token().get();
        ga.release().await.unwrap();
        let gb = b.mutex("svc/x").unwrap().lock().await.unwrap();
        assert!(a.mutex("x").unwrap().try_lock().await.unwrap().is_none());
        assert!(gb.token().get() > last);
        last = gb.token().get();
        gb.release().await.unwrap();
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// `wait_for_replicas` refuses a replica timeout that is not shorter than the request timeout,
/// and without a replica no grant is handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_without_replicas() {
    let Some(f) = RedisFactory::shared().await else {
        return;
    };
    let url = f.server.url();
    let r = RedisConfig::new(url.as_str())
        .timeout(Duration::from_secs(1))
        .wait_for_replicas(1, Duration::from_secs(1))
        .connect()
        .await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    let backend = RedisConfig::new(url.as_str())
        .wait_for_replicas(1, Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let r = Session::builder(backend)
        .start_timeout(Duration::from_secs(1))
        .start()
        .await;
    assert!(
        r.is_err(),
        "a session is not acknowledged by any replica: {r:?}"
    );
}

/// A server that wants a password: no password (`NOAUTH`) and a wrong one are
/// `Unauthenticated`; a user whose ACL forbids fencelock's channels (all, or the sessions'
/// own) is `PermissionDenied` at connect, before anything is changed; Redlock returns those at
/// once instead of retrying for ever. All within a bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_permissions_are_permanent_errors() {
    use fencelock_redis::Redlock;
    let Some(server) = server_with(&[
        "ACL SETUSER app on >app-pw ~* &* +@all",
        "ACL SETUSER mute on >mute-pw ~* resetchannels +@all",
        // fencelock's entry and head channels, not the sessions' own.
        "ACL SETUSER partial on >partial-pw ~* resetchannels &fencelock:c:* &fencelock:h:* +@all",
        // The head channels and the sessions' own, not the entries'.
        "ACL SETUSER noentry on >noentry-pw ~* resetchannels &fencelock:h:* &fencelock:w:* +@all",
        "CONFIG SET requirepass s3cret",
    ])
    .await
    else {
        return;
    };
    let addr = server.addr();
    let bound = Duration::from_secs(10);
    let connect = |url: String| async move {
        tokio::time::timeout(bound, RedisBackend::connect(url))
            .await
            .expect("an answer within the bound")
    };
    let ok = connect(format!("redis://app:app-pw@{addr}")).await;
    let s = Session::builder(ok.unwrap()).start().await.unwrap();
    s.mutex("m")
        .unwrap()
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    s.close().await.unwrap();
    for (url, what) in [
        (format!("redis://{addr}"), "no password"),
        (format!("redis://:wrong@{addr}"), "wrong password"),
        (
            format!("redis://app:wrong@{addr}"),
            "wrong password of a user",
        ),
    ] {
        let r = connect(url).await;
        assert!(
            matches!(r, Err(Error::Unauthenticated { .. })),
            "{what}: {r:?}"
        );
    }
    let r = connect(format!("redis://mute:mute-pw@{addr}")).await;
    assert!(matches!(r, Err(Error::PermissionDenied { .. })), "{r:?}");
    // Refused at connect too: a release publishes on the channel of the next waiter's
    // session, and a refused PUBLISH would stop its script half done.
    let r = connect(format!("redis://partial:partial-pw@{addr}")).await;
    assert!(matches!(r, Err(Error::PermissionDenied { .. })), "{r:?}");
    // And an entry's own channel: a release publishes there last, after its deletes (a
    // release refused half done, reported as an error, its entry gone).
    let r = connect(format!("redis://noentry:noentry-pw@{addr}")).await;
    assert!(matches!(r, Err(Error::PermissionDenied { .. })), "{r:?}");

    for url in [format!("redis://{addr}"), format!("redis://:wrong@{addr}")] {
        let redlock = Redlock::connect([url.clone()]).unwrap();
        let r = tokio::time::timeout(
            bound,
            redlock.lock_timeout("x", Duration::from_secs(5), Duration::MAX),
        )
        .await
        .expect("Redlock gives up on a permanent error");
        assert!(
            matches!(&r, Err(e @ Error::Unauthenticated { .. }) if !e.is_temporary()),
            "{url}: {r:?}"
        );
    }
}

/// Waits (bounded) until mutex `name` of `s`'s namespace has a waiter; `what` names the wait.
async fn until_queued(s: &Session, name: &str, what: &str) {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.mutex(name).unwrap().waiters().await.unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < until, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `N` sessions on the Redis at `url`, in namespace `ns`, of TTL `ttl`.
async fn sessions_on<const N: usize>(url: &str, ns: &str, ttl: Duration) -> [Session; N] {
    let mut all = Vec::with_capacity(N);
    for _ in 0..N {
        let backend = RedisBackend::connect(url).await.unwrap();
        all.push(
            Session::builder(backend)
                .namespace(ns)
                .ttl(ttl)
                .start()
                .await
                .unwrap(),
        );
    }
    all.try_into().unwrap_or_else(|_| unreachable!())
}

/// Waits (bounded) until the sorted set `queue` on `server` has `n` members.
async fn until_members(
    server: &fencelock_integration::servers::redis::RedisServer,
    queue: &str,
    n: usize,
) {
    let since = std::time::Instant::now();
    while server.cli(&["ZCARD", queue]).unwrap().trim() != n.to_string() {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "{queue}: never {n} members"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until a client listens on `channel` on `server`.
async fn until_subscribed(
    server: &fencelock_integration::servers::redis::RedisServer,
    channel: &str,
) {
    let since = std::time::Instant::now();
    let listening = || server.cli(&["PUBSUB", "NUMSUB", channel]).unwrap();
    while listening().lines().nth(1).map(str::trim) != Some("1") {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "{channel}: never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many clients are subscribed to `channel`.
async fn subscribers(con: &mut fencelock_redis::RedisConnection, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(con)
        .await
        .unwrap();
    n
}

/// Waits (bounded) until `channel` has `n` subscribers.
async fn until_subscribers(
    con: &mut fencelock_redis::RedisConnection,
    channel: &str,
    n: i64,
    what: &str,
) {
    let start = std::time::Instant::now();
    while subscribers(con, channel).await != n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{what}: not {n} subscribers"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A wait's subscription ends with the wait: once a waiter is granted, or its `lock()` is
/// dropped (over and over, at every point), nobody is left subscribed to the entry it waited
/// on — entry names repeat, and a stale subscriber would be woken by the next entry of that
/// name. After its first wait, a session's waits subscribe to nothing: they hear a release on
/// the session's own channel (one subscriber, until the session closes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_end_with_their_waits() {
    let Some(f) = RedisFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("subscriptions");
    let open = || {
        Session::builder(f.redis().clone())
            .namespace(ns.clone())
            .start()
    };
    let (a, b) = (open().await.unwrap(), open().await.unwrap());
    let mut con = f.redis().connection();
    let channel = format!("fencelock:c:{ns}/x/{}", a.id());
    let own = format!("fencelock:w:{}", b.id());

    // Waits dropped at many points.
    let held = a.mutex("x").unwrap().lock().await.unwrap();
    let mb = b.mutex("x").unwrap();
    for i in 0..200u64 {
        let _ = tokio::time::timeout(Duration::from_micros(50 * (i % 40)), mb.lock()).await;
    }
    b.flush().await;
    until_subscribers(&mut con, &channel, 0, "after 200 cancelled waits").await;
    until_subscribers(&mut con, &own, 1, "b's own channel after its waits").await;

    // A wait that ends in a grant: queued, heard on b's own channel, and by nobody on the
    // entry it waits for.
    let waiter = tokio::spawn(async move { mb.lock().await.unwrap() });
    until_queued(&a, "x", "b never queued").await;
    assert_eq!(
        subscribers(&mut con, &channel).await,
        0,
        "b subscribed to a's entry"
    );
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("b granted")
        .unwrap();
    until_subscribers(&mut con, &channel, 0, "after b's grant").await;
    guard.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
    until_subscribers(&mut con, &own, 0, "b closed").await;
}

/// A late release message (on a cluster a `PUBLISH` reaches the subscriber's node over the
/// cluster bus, after the script's reply, and a mutex's entry has the same name each time its
/// session queues) that names the waiter as the new head with another token grants nothing:
/// the waiter reads the queue again and waits on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_head_message_grants_nothing() {
    let Some(f) = RedisFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("stale_head");
    let start = || {
        Session::builder(f.redis().clone())
            .namespace(ns.as_str())
            .start()
    };
    let (a, b) = (start().await.unwrap(), start().await.unwrap());
    let held = a.mutex("m").unwrap().lock().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.mutex("m").unwrap().lock().await })
    };
    until_queued(&a, "m", "the waiter never queued").await;
    let con = f.redis().connection();
    // An earlier entry of the waiter's name, with token 1: not the one that waits now. On the
    // held entry's channel (which the session's first wait heard) and on the waiter's
    // session's own channel (which its later waits hear).
    let stale = [
        (
            format!("fencelock:c:{}", held.key()),
            format!("gone {ns}/m/{} 1", b.id()),
        ),
        (
            format!("fencelock:w:{}", b.id()),
            format!("{ns}/m/{} 1 head", b.id()),
        ),
    ];
    let publish_stale = |mut con: fencelock_redis::RedisConnection| {
        let stale = stale.clone();
        async move {
            for _ in 0..3 {
                for (channel, message) in &stale {
                    let _: i64 = redis::cmd("PUBLISH")
                        .arg(channel)
                        .arg(message)
                        .query_async(&mut con)
                        .await
                        .unwrap();
                }
            }
        }
    };
    publish_stale(con.clone()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "granted while held: {:?}",
        waiter.await
    );
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted after the release")
        .unwrap()
        .unwrap();

    // Again, now that the waiter's session hears its own channel: its second wait.
    let a_again = {
        let a = a.clone();
        tokio::spawn(async move { a.mutex("m").unwrap().lock().await })
    };
    until_queued(&b, "m", "a never queued").await;
    got.release().await.unwrap();
    let held = tokio::time::timeout(Duration::from_secs(10), a_again)
        .await
        .expect("a granted")
        .unwrap()
        .unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.mutex("m").unwrap().lock().await })
    };
    until_queued(&a, "m", "the waiter never queued again").await;
    publish_stale(con).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "granted while held, on its second wait: {:?}",
        waiter.await
    );
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted after the release")
        .unwrap()
        .unwrap();
    got.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The scripts run as functions of fencelock's library where the server has functions (loaded
/// by the first call that finds it missing, again after an operator's `FUNCTION FLUSH`), and by
/// `EVALSHA` for a user who may not load or call functions: locks work either way, within a
/// bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_run_as_functions_or_without_them() {
    let Some(server) = server_with(&[
        "ACL SETUSER app on >app-pw ~* &* +@all",
        "ACL SETUSER noload on >noload-pw ~* &* +@all -function",
        "ACL SETUSER nofcall on >nofcall-pw ~* &* +@all -function -fcall",
    ])
    .await
    else {
        return;
    };
    let addr = server.addr();
    let libraries = |server: &fencelock_integration::servers::redis::RedisServer| {
        let list = server
            .cli(&["FUNCTION", "LIST", "LIBRARYNAME", "fencelock_*"])
            .unwrap();
        list.lines().filter(|l| *l == "library_name").count()
    };
    let bound = Duration::from_secs(20);
    let lock_twice = |user: &'static str| {
        let url = format!("redis://{user}:{user}-pw@{addr}");
        async move {
            tokio::time::timeout(bound, async {
                let backend = RedisBackend::connect(url).await.unwrap();
                let s = Session::builder(backend).start().await.unwrap();
                let m = s.mutex("fn").unwrap();
                for _ in 0..2 {
                    m.lock().await.unwrap().release().await.unwrap();
                }
                s.close().await.unwrap();
            })
            .await
            .unwrap_or_else(|_| panic!("{user}: locks within the bound"));
        }
    };
    lock_twice("noload").await;
    lock_twice("nofcall").await;
    assert_eq!(libraries(&server), 0, "nothing loaded without the right");
    lock_twice("app").await;
    assert_eq!(libraries(&server), 1, "loaded by the first call");

    // Flushed while a lock is held: the release and what follows load it again.
    let backend = RedisBackend::connect(format!("redis://app:app-pw@{addr}"))
        .await
        .unwrap();
    let s = Session::builder(backend).start().await.unwrap();
    let m = s.mutex("flushed").unwrap();
    let g = m.lock().await.unwrap();
    assert_eq!(server.cli(&["FUNCTION", "FLUSH"]).unwrap().trim(), "OK");
    tokio::time::timeout(bound, async {
        g.release().await.unwrap();
        m.lock().await.unwrap().release().await.unwrap();
    })
    .await
    .expect("released and locked again within the bound");
    assert_eq!(libraries(&server), 1, "loaded again");
    s.close().await.unwrap();
}

/// A server at its memory limit (`maxmemory`, no eviction) refuses new entries and sessions
/// ([`Error::OutOfSpace`]), but keeps the sessions it has: heartbeats and releases still run (the library's functions that add
/// nothing may run at the limit, as scripts could), a held lock outlives several TTLs and is
/// released; once memory is allowed again, locks are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_memory_limit_sessions_live_and_new_entries_are_refused() {
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let ttl = Duration::from_secs(1);
    let backend = RedisBackend::connect(server.url()).await.unwrap();
    let s = Session::builder(backend).ttl(ttl).start().await.unwrap();
    let m = s.mutex("oom").unwrap();
    let g = m.lock().await.unwrap();
    let limit = |bytes: &str| {
        assert_eq!(
            server
                .cli(&["CONFIG", "SET", "maxmemory", bytes])
                .unwrap()
                .trim(),
            "OK"
        )
    };
    limit("1");
    let other = s.mutex("oom-other").unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(10), other.lock())
        .await
        .expect("an answer within the bound");
    assert!(
        matches!(&refused, Err(Error::OutOfSpace { .. })),
        "a new entry at the limit: {refused:?}"
    );
    let other_session = tokio::time::timeout(Duration::from_secs(10), async {
        let b = RedisBackend::connect(server.url()).await?;
        Session::builder(b).ttl(ttl).start().await
    })
    .await
    .expect("an answer within the bound")
    .map(drop);
    assert!(
        matches!(&other_session, Err(Error::OutOfSpace { .. })),
        "a new session at the limit: {other_session:?}"
    );
    // Several TTLs of heartbeats at the limit: the session and its lock stay.
    let lost = tokio::time::timeout(ttl * 5, s.lost()).await;
    assert!(lost.is_err(), "the session ended at the limit: {lost:?}");
    g.release().await.expect("a release at the limit");
    limit("0");
    m.lock().await.unwrap().release().await.unwrap();
    s.close().await.unwrap();
}

/// One session waiting on several locks at once: each release grants the one wait it names on
/// the session's own channel, and the others wait on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_many_waits_each_granted_by_its_release() {
    let Some(f) = RedisFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("many_waits");
    let open = || {
        Session::builder(f.redis().clone())
            .namespace(ns.clone())
            .start()
    };
    let (a, b) = (open().await.unwrap(), open().await.unwrap());
    let wait_for = |name: String| {
        let b = b.clone();
        tokio::spawn(async move { b.mutex(&name).unwrap().lock().await.unwrap() })
    };
    // b's first wait (which subscribes to its own channel) out of the way.
    let g = a.mutex("warm").unwrap().lock().await.unwrap();
    let w = wait_for("warm".into());
    until_queued(&a, "warm", "warm: never queued").await;
    g.release().await.unwrap();
    w.await.unwrap().release().await.unwrap();

    let mut held = Vec::new();
    for i in 0..4 {
        held.push(a.mutex(&format!("m{i}")).unwrap().lock().await.unwrap());
    }
    let mut waits: Vec<_> = (0..4).map(|i| wait_for(format!("m{i}"))).collect();
    for i in 0..4 {
        until_queued(&a, &format!("m{i}"), "a wait never queued").await;
    }
    for (i, g) in held.into_iter().enumerate().rev() {
        g.release().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), &mut waits[i])
            .await
            .unwrap_or_else(|_| panic!("m{i}: granted within the bound"))
            .unwrap();
        assert_eq!(got.key(), format!("{ns}/m{i}/{}", b.id()));
        for (j, w) in waits.iter().enumerate().take(i) {
            assert!(!w.is_finished(), "m{j} granted by m{i}'s release");
        }
        got.release().await.unwrap();
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A held entry deleted outside fencelock's scripts (an operator's `DEL`, an eviction under a
/// `maxmemory` policy), which publishes nothing, or taken out of its queue (the queue's key
/// deleted): `lost()` fires all the same, within a few seconds at a TTL of 3 s, and the next
/// waiter is granted with a greater token. It never fired: the `fencelock` command ran on
/// beside the next holder until its end (black-box round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_deleted_behind_our_back_is_lost() {
    use fencelock::LostReason;
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let url = format!("redis://{}", server.addr());
    let ns = fencelock::conformance::unique_namespace("deleted_outside");
    let [a, b] = sessions_on(&url, &ns, Duration::from_secs(3)).await;
    let mut admin = RedisBackend::connect(url.as_str())
        .await
        .unwrap()
        .connection();
    for what in ["entry", "queue"] {
        let g = a.mutex(what).unwrap().lock().await.unwrap();
        assert!(
            fencelock_redis::guarded_set(&mut admin, &g, "guarded", b"held")
                .await
                .unwrap()
        );
        let lost = tokio::spawn(g.lost());
        // Deleted once the wait listens (subscribed to the entry's channel, then read it).
        let channel = format!("fencelock:c:{}", g.key());
        until_subscribed(&server, &channel).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let entry = format!("fencelock:e:{}", g.key());
        let key = match what {
            "entry" => entry,
            _ => format!(
                "fencelock:q:{}",
                server.cli(&["HGET", &entry, "q"]).unwrap().trim()
            ),
        };
        assert_eq!(server.cli(&["DEL", &key]).unwrap().trim(), "1", "{key}");
        // Refused by Redis at once, before the holder knows (its guarded writes checked only
        // the entry's hash and session, not its queue: review).
        let written = fencelock_redis::guarded_set(&mut admin, &g, "guarded", b"late").await;
        assert!(!written.unwrap(), "{what} deleted: a guarded write applied");
        let reason = tokio::time::timeout(Duration::from_secs(10), lost)
            .await
            .unwrap_or_else(|_| panic!("{what} deleted: lost() did not fire"))
            .unwrap();
        assert_eq!(reason, LostReason::EntryDeleted, "{what}");
        assert!(!g.is_held(), "{what}");
        let next = b.mutex(what).unwrap().try_lock().await.unwrap();
        assert!(next.expect("free").token() > g.token(), "{what}");
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A session's heartbeat renews its entries' expiries (hashes and queues, 60 TTLs) a slice
/// at a time once it owns more than 256, going on where the last beat stopped: within a few
/// beats every one is renewed, not only the first slice. (One heartbeat that renewed them all
/// blocked the server for 0.5-1 s at 100,000 held locks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_renews_many_entries_a_slice_at_a_time() {
    use futures::StreamExt;
    const LOCKS: usize = 600;
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let url = format!("redis://{}", server.addr());
    let ns = fencelock::conformance::unique_namespace("slices");
    let [s] = sessions_on(&url, &ns, Duration::from_secs(1)).await;
    let guards: Vec<_> = futures::stream::iter(0..LOCKS)
        .map(|i| {
            let m = s.mutex(&format!("l{i}")).unwrap();
            async move { m.lock().await.unwrap() }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    // The least time left to a key of `pattern` (ms), and how many keys it matches.
    let least = |pattern: &str| -> (i64, usize) {
        let script = "local m, n = -3, 0 \
            for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
              local t = redis.call('PTTL', k) n = n + 1 \
              if m == -3 or t < m then m = t end \
            end return {m, n}";
        let out = server.cli(&["EVAL", script, "0", pattern]).unwrap();
        let mut words = out.split_whitespace().map(|w| w.parse().unwrap());
        (words.next().unwrap(), words.next().unwrap() as usize)
    };
    // 8 s: an entry left out of the renewals has 52 s left at most, one renewed within the
    // last 4 s (the whole cycle is three beats, a third of a second apart) 56 s at least.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (entries, queues) =
        tokio::task::block_in_place(|| (least("fencelock:e:*"), least("fencelock:q:*")));
    assert_eq!((entries.1, queues.1), (LOCKS, LOCKS));
    assert!(
        entries.0 > 56_000,
        "an entry not renewed: {} ms left",
        entries.0
    );
    assert!(
        queues.0 > 56_000,
        "a queue not renewed: {} ms left",
        queues.0
    );
    assert_eq!(s.state(), fencelock::SessionState::Live);
    assert!(guards.iter().all(|g| g.is_held()));
    for g in guards {
        g.release().await.unwrap();
    }
    s.close().await.unwrap();
}

/// A waiter's own entry hash deleted by hand (or evicted) while it waits behind a holder that
/// lives on: its session's next heartbeat (a third of its TTL) drops what the entry left in
/// the queue and tells the wait on the session's own channel, which reads and fails with
/// `EntryVanished`. Before, it waited until the holder's session would have expired (a TTL of
/// the holder's: 8.5 s after the deletion, by hand, at 10 s), or, the session's first wait,
/// until the holder released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_entry_was_deleted_learns_it_at_its_heartbeat() {
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let url = format!("redis://{}", server.addr());
    let ns = fencelock::conformance::unique_namespace("waiter_deleted");
    let [a] = sessions_on(&url, &ns, Duration::from_secs(30)).await;
    let [b] = sessions_on(&url, &ns, Duration::from_secs(3)).await;
    // b's first wait (which makes it listen on its own channel) out of the way.
    let g = a.mutex("warm").unwrap().lock().await.unwrap();
    let bw = b.clone();
    let w = tokio::spawn(async move { bw.mutex("warm").unwrap().lock().await.unwrap() });
    until_queued(&a, "warm", "warm: never queued").await;
    g.release().await.unwrap();
    w.await.unwrap().release().await.unwrap();

    deleted_while_waiting(&server, &ns, &a, &b, "m").await;
    assert!(b.mutex("m").unwrap().try_lock().await.unwrap().is_some());
    a.close().await.unwrap();
    b.close().await.unwrap();

    // The same on a session's first wait (a command's: one lock, one session), which listened
    // on the entry ahead of it alone (black-box round 15: it waited for the holder's release).
    let [c] = sessions_on(&url, &ns, Duration::from_secs(30)).await;
    let [d] = sessions_on(&url, &ns, Duration::from_secs(3)).await;
    deleted_while_waiting(&server, &ns, &c, &d, "first").await;
    c.close().await.unwrap();
    d.close().await.unwrap();
}

/// `holder` holds `name`, `waiter` waits for it, and the waiter's entry hash is deleted by
/// hand: the wait ends with `EntryVanished` within a few of the waiter's heartbeats (its TTL is
/// short, the holder's long), and the holder still holds, then releases.
async fn deleted_while_waiting(
    server: &fencelock_integration::servers::redis::RedisServer,
    ns: &str,
    holder: &Session,
    waiter: &Session,
    name: &str,
) {
    let held = holder.mutex(name).unwrap().lock().await.unwrap();
    let (w, n) = (waiter.clone(), name.to_string());
    let waiting = tokio::spawn(async move { w.mutex(&n).unwrap().lock().await.map(drop) });
    until_queued(holder, name, "never queued").await;
    let entry = format!("fencelock:e:{ns}/{name}/{}", waiter.id());
    let (member, queue) = (
        format!("{ns}/{name}/{}", waiter.id()),
        format!("fencelock:q:{ns}/{name}"),
    );
    let score = || server.cli(&["ZSCORE", &queue, &member]).unwrap();
    assert!(!score().trim().is_empty(), "{member} not in {queue}");
    assert_eq!(server.cli(&["DEL", &entry]).unwrap().trim(), "1", "{entry}");
    let ended = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap_or_else(|_| panic!("{name}: the wait did not learn of its deleted entry"))
        .unwrap();
    assert!(
        matches!(ended, Err(Error::EntryVanished { .. })),
        "{name}: {ended:?}"
    );
    // What the deleted hash left in the queue is gone by then, whichever saw the delete
    // first, the session's heartbeat or the wait's own look (CI once found it still there).
    let left = score();
    assert!(left.trim().is_empty(), "{name}: left in the queue: {left}");
    assert!(held.is_held(), "{name}");
    held.release().await.unwrap();
}

/// A holder's entry hash deleted by hand (or evicted) while another waits: the holder learns
/// it lost, and its release, finding the hash gone, drops the member it left in the queue and
/// wakes the waiter at once. Before, the waiter was granted only at its own next check of the
/// holder's session (a TTL later: 9 s in a black-box round), and a read-write lock's waiter
/// likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_its_hash_was_deleted_wakes_the_next() {
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let url = format!("redis://{}", server.addr());
    let ns = fencelock::conformance::unique_namespace("hash_deleted");
    let [a, b] = sessions_on(&url, &ns, Duration::from_secs(10)).await;
    for rw in [false, true] {
        let (held, waiting) = if rw {
            let la = a.rwlock("rw").unwrap();
            let lb = b.rwlock("rw").unwrap();
            let g = la.write().await.unwrap();
            let w = tokio::spawn(async move { lb.write().await.map(|g| g.token()) });
            (g.token(), (Some(g), None, w))
        } else {
            let g = a.mutex("m").unwrap().lock().await.unwrap();
            let mb = b.mutex("m").unwrap();
            let w = tokio::spawn(async move { mb.lock().await.map(|g| g.token()) });
            (g.token(), (None, Some(g), w))
        };
        let (wg, mg, waiting) = waiting;
        let key = wg.as_ref().map_or_else(
            || mg.as_ref().unwrap().key().to_string(),
            |g| g.key().to_string(),
        );
        let queue = if rw {
            format!("fencelock:q:{ns}/rw//rw")
        } else {
            format!("fencelock:q:{ns}/m")
        };
        until_members(&server, &queue, 2).await;
        let hash = format!("fencelock:e:{key}");
        assert_eq!(server.cli(&["DEL", &hash]).unwrap().trim(), "1");
        let released = std::time::Instant::now();
        match (wg, mg) {
            (Some(g), _) => assert!(g.release().await.is_err(), "rw {rw}: released as held"),
            (_, Some(g)) => assert!(g.release().await.is_err(), "rw {rw}: released as held"),
            _ => unreachable!(),
        }
        let token = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .unwrap_or_else(|_| panic!("rw {rw}: the waiter not woken by the release"))
            .unwrap()
            .unwrap();
        assert!(token > held, "rw {rw}");
        assert!(released.elapsed() < Duration::from_secs(2));
        b.flush().await;
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A revocation request written by hand (`HSET … v __REVOKE__`, which publishes nothing, as a
/// message lost on a cluster's bus): the holder hears of it all the same, at its next read of
/// its entry. It waited for a message for ever (review of the Redis backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_written_by_hand_is_heard() {
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let url = format!("redis://{}", server.addr());
    let ns = fencelock::conformance::unique_namespace("revoke_by_hand");
    let [a] = sessions_on(&url, &ns, Duration::from_secs(3)).await;
    let g = a.mutex("m").unwrap().lock().await.unwrap();
    let asked = tokio::spawn(g.revoke_requested());
    // Once the wait listens (subscribed to the entry's channel, then read it).
    let channel = format!("fencelock:c:{}", g.key());
    until_subscribed(&server, &channel).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let entry = format!("fencelock:e:{}", g.key());
    server.cli(&["HSET", &entry, "v", "__REVOKE__"]).unwrap();
    tokio::time::timeout(Duration::from_secs(5), asked)
        .await
        .expect("a revocation written by hand never heard")
        .unwrap();
    g.release().await.unwrap();
    a.close().await.unwrap();
}

/// The token counter deleted by hand (or evicted) while a lock is held: it starts again from
/// 1, and a newcomer's entry scored 1 queued ahead of the holder and was granted beside it
/// (black-box round 13: 5 of 5). A new entry is now scored above every member of its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_deleted_under_a_holder_does_not_let_a_newcomer_ahead() {
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let url = format!("redis://{}", server.addr());
    let ns = fencelock::conformance::unique_namespace("counter_deleted");
    let [a, b] = sessions_on(&url, &ns, Duration::from_secs(3)).await;
    server.cli(&["SET", "fencelock:t", "100"]).unwrap();
    let g = a.mutex("m").unwrap().lock().await.unwrap();
    assert_eq!(g.token().get(), 101);
    assert_eq!(server.cli(&["DEL", "fencelock:t"]).unwrap().trim(), "1");
    let tried = b.mutex("m").unwrap().try_lock().await.unwrap();
    assert!(
        tried.is_none(),
        "granted beside the holder (token {:?})",
        tried.map(|t| t.token())
    );
    // Raised past the queue's last member, and the counter with it.
    let mb = b.mutex("m").unwrap();
    let waiting = tokio::spawn(async move { mb.lock().await.map(|g| g.token()) });
    g.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter never granted")
        .unwrap()
        .unwrap();
    assert!(next.get() > 101, "{next}");
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A holder whose queue's key (or session's key) was deleted by hand, released before it read
/// its entry again: its release says that it held nothing (`NotHeld`), so that a command that
/// exited meanwhile exits 76, not 0 (black-box round 13: exit 0 beside another holder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_its_queue_or_session_was_deleted_is_not_a_release() {
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let url = format!("redis://{}", server.addr());
    let ns = fencelock::conformance::unique_namespace("release_deleted");
    for what in ["queue", "session"] {
        let [a] = sessions_on(&url, &ns, Duration::from_secs(30)).await;
        let g = a.mutex(what).unwrap().lock().await.unwrap();
        let key = match what {
            "queue" => format!("fencelock:q:{ns}/{what}"),
            _ => format!("fencelock:s:{}", a.id()),
        };
        assert_eq!(server.cli(&["DEL", &key]).unwrap().trim(), "1", "{key}");
        let released = g.release().await;
        assert!(
            matches!(released, Err(Error::NotHeld(_))),
            "{what} deleted: {released:?}"
        );
        let _ = a.close().await;
    }
}

/// A holder's entry hash deleted by hand while another waits, and the holder's session then
/// closed without a release (as `fencelock` does when it found the grant lost): the close drops
/// what the entry left in its queue and wakes the waiter at once. It waited for its own next
/// check, up to a TTL (black-box round 13: 6.65 s at a TTL of 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_after_a_hash_was_deleted_wakes_the_next() {
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let url = format!("redis://{}", server.addr());
    let ns = fencelock::conformance::unique_namespace("close_hash_deleted");
    let [a, b] = sessions_on(&url, &ns, Duration::from_secs(10)).await;
    let g = a.mutex("m").unwrap().lock().await.unwrap();
    let mb = b.mutex("m").unwrap();
    let waiting = tokio::spawn(async move { mb.lock().await.map(|g| g.token()) });
    let queue = format!("fencelock:q:{ns}/m");
    until_members(&server, &queue, 2).await;
    let hash = format!("fencelock:e:{}", g.key());
    assert_eq!(server.cli(&["DEL", &hash]).unwrap().trim(), "1");
    std::mem::forget(g);
    a.close().await.unwrap();
    let token = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("the waiter not woken by the close")
        .unwrap()
        .unwrap();
    assert!(token.get() > 1);
    b.close().await.unwrap();
}

/// A queue's key deleted by hand (or evicted) while one holds and another waits: the next
/// acquirer finds the queue empty and is granted; the waiter, whose entry is out of the queue
/// too, must not be granted beside it. It was: its read of what is ahead found only the new
/// holder, of a greater token (review of the Redis backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_out_of_its_deleted_queue_is_not_granted() {
    let Some(server) = server_with(&[]).await else {
        return;
    };
    let url = format!("redis://{}", server.addr());
    let ns = fencelock::conformance::unique_namespace("queue_deleted");
    let [a, b, c] = sessions_on(&url, &ns, Duration::from_secs(3)).await;
    let g = a.mutex("m").unwrap().lock().await.unwrap();
    let mb = b.mutex("m").unwrap();
    let waiting = tokio::spawn(async move { mb.lock().await.map(|g| g.token()) });
    let queue = format!("fencelock:q:{ns}/m");
    until_members(&server, &queue, 2).await;
    assert_eq!(server.cli(&["DEL", &queue]).unwrap().trim(), "1");
    let held = c.mutex("m").unwrap().try_lock().await.unwrap();
    let held = held.expect("the queue is empty: c is granted");
    // Out of the queue, a's and b's entries hold nothing: not listed (they were, with c's).
    let listed = c.list_entries().await.unwrap();
    assert_eq!(listed, vec![held.key().to_string()]);
    // a learns that it lost within a TTL; its release wakes b, which finds its own entry out
    // of the queue.
    let lost = tokio::time::timeout(Duration::from_secs(10), g.lost()).await;
    assert!(lost.is_ok(), "a never learnt it lost");
    assert!(g.release().await.is_err(), "a released as held");
    let done = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("b never told that its entry left the queue");
    match done.unwrap() {
        Ok(token) => panic!(
            "b granted (token {token}) while c holds (token {})",
            held.token()
        ),
        Err(e) => assert!(matches!(e, Error::EntryVanished { .. }), "{e:?}"),
    }
    assert!(held.is_held());
    held.release().await.unwrap();
    for s in [a, b, c] {
        s.close().await.unwrap();
    }
}

/// An entry dropped because its session's key expired (not by its owner: here an entry written
/// by hand, as a killed process leaves it) marks its queue for 10 s (`fencelock:x:{path}`),
/// and tells the waiter now at the head `expired`, not `head`: behind Sentinel, a grant that
/// follows such a drop asks the sentinels first (`redis_sentinel.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_entry_dropped_marks_its_queue_and_says_so() {
    use fencelock_integration::servers::redis as harness;
    use futures::StreamExt;
    let Some(server) = harness::shared() else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("expired_mark");
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let s = Session::builder(backend)
        .namespace(ns.as_str())
        .start()
        .await
        .unwrap();
    let (queue, sid) = (format!("{ns}/m"), "0000000000000000000000000000000d");
    tokio::task::block_in_place(|| server.write_entry(&queue, sid, 1500));
    let mut own = redis::Client::open(server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    own.subscribe(format!("fencelock:w:{}", s.id()))
        .await
        .unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), s.mutex("m").unwrap().lock())
        .await
        .expect("never granted after the entry ahead expired")
        .unwrap();
    let said: String = tokio::time::timeout(Duration::from_secs(5), own.on_message().next())
        .await
        .expect("no message on the waiter's own channel")
        .unwrap()
        .get_payload()
        .unwrap();
    assert_eq!(
        said,
        format!("{} {} expired", guard.key(), guard.token().get())
    );
    let left: i64 = tokio::task::block_in_place(|| {
        server
            .cli(&["PTTL", &format!("fencelock:x:{queue}")])
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    });
    assert!(
        (1..=10_000).contains(&left),
        "the queue's mark: PTTL {left}"
    );
    guard.release().await.unwrap();
    s.close().await.unwrap();
}
