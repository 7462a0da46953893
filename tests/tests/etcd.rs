//! The conformance suite and etcd-specific behaviour against a real etcd member started by the
//! harness.

use std::time::Duration;

use fencelock::{Error, Session};
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_integration::servers::etcd::EtcdFactory;

fencelock::conformance_tests!(EtcdFactory::shared());

/// Keys follow the Go `clientv3/concurrency` layout and the token is the key's create
/// revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_compatible_layout_and_create_revision_token() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let s = Session::builder(f.etcd().clone())
        .namespace("layout")
        .start()
        .await
        .unwrap();
    let g = s.mutex("jobs/reindex").unwrap().lock().await.unwrap();
    assert_eq!(g.key(), format!("layout/jobs/reindex/{}", s.id()));
    let mut kv = f.etcd().client().kv_client();
    let got = kv.get(g.key(), None).await.unwrap();
    let kv0 = &got.kvs()[0];
    assert_eq!(kv0.create_revision() as u64, g.token().get());
    assert_eq!(format!("{:x}", kv0.lease()), s.id());
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// Elections use the Go `concurrency.Election` layout: `{prefix}/{lease hex}` holding the
/// value; the epoch is the key's create revision; `proclaim` rewrites the value in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_compatible_election_layout() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let s = Session::builder(f.etcd().clone())
        .namespace("")
        .start()
        .await
        .unwrap();
    let name = format!("elect-{}", std::process::id());
    let l = s
        .election(&name)
        .unwrap()
        .campaign(b"node-a:8080")
        .await
        .unwrap();
    assert_eq!(l.key(), format!("/{name}/{}", s.id()));
    let mut kv = f.etcd().client().kv_client();
    let got = kv.get(l.key(), None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"node-a:8080");
    assert_eq!(got.kvs()[0].create_revision() as u64, l.epoch().get());
    l.proclaim(b"node-a:9090").await.unwrap();
    let got = kv.get(l.key(), None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"node-a:9090");
    assert_eq!(got.kvs()[0].create_revision() as u64, l.epoch().get());
    l.resign().await.unwrap();
    s.close().await.unwrap();
}

/// An unreachable endpoint fails with `Error::Connect` after the bounded connect timeout; no
/// endpoint at all is a configuration error.
#[tokio::test]
async fn unreachable_endpoint_is_a_connect_error() {
    let port = fencelock_integration::free_port();
    let config = EtcdConfig::new(vec![format!("127.0.0.1:{port}")])
        .connect_timeout(Duration::from_millis(500));
    let start = std::time::Instant::now();
    let r = EtcdBackend::connect_with(config).await;
    assert!(matches!(r, Err(Error::Connect { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    // Several: each named as given, not in the client's `http://` form.
    let other = fencelock_integration::free_port();
    let given = [format!("127.0.0.1:{port}"), format!("localhost:{other}")];
    let config = EtcdConfig::new(given.clone()).connect_timeout(Duration::from_millis(500));
    let e = EtcdBackend::connect_with(config).await.unwrap_err();
    let e = format!(
        "{e}: {}",
        std::error::Error::source(&e).expect("the causes")
    );
    assert!(!e.contains("http://"), "{e}");
    for ep in &given {
        assert!(e.contains(&format!("{ep}: ")), "{ep} in {e}");
    }
    let r = EtcdBackend::connect(Vec::<String>::new()).await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
}

/// One endpoint takes connections and never answers (a hung member), another is healthy: the
/// connect goes through the healthy one without waiting out the connect timeout for the hung
/// one (it waited the whole 5 s), and locks work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_endpoint_does_not_hold_up_the_connect() {
    use fencelock_integration::servers::Cluster;
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let hung = fencelock_integration::HungServer::start().await;
    let config = EtcdConfig::new([hung.addr(), f.cluster.endpoint(0)])
        .connect_timeout(Duration::from_secs(5));
    let start = std::time::Instant::now();
    let backend = EtcdBackend::connect_with(config).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    let s = Session::builder(backend)
        .namespace(fencelock::conformance::unique_namespace("hung_endpoint"))
        .start()
        .await
        .unwrap();
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// A namespace whose keys make more than 4 MiB (the client's default reply limit; 100,000 locks
/// do): listing it works (it failed with a permanent "message too large").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_listing_past_4_mib() {
    use etcd_client::{Txn, TxnOp};
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("big_listing");
    let mut client = f.etcd().client().clone();
    let padding = "p".repeat(480);
    let keys: Vec<String> = (0..9_000)
        .map(|i| format!("{ns}/q{i:05}{padding}/entry"))
        .collect();
    for batch in keys.chunks(128) {
        let ops: Vec<TxnOp> = batch
            .iter()
            .map(|k| TxnOp::put(k.as_str(), "", None))
            .collect();
        client.txn(Txn::new().and_then(ops)).await.unwrap();
    }
    let s = Session::builder(f.etcd().clone())
        .namespace(&ns)
        .start()
        .await
        .unwrap();
    let listed = s.list_entries().await.unwrap();
    assert_eq!(listed.len(), keys.len());
    s.close().await.unwrap();
    client
        .delete(
            format!("{ns}/"),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
}

/// The read-write lock follows Go `contrib/recipes` `RWMutex`'s layout: a client writing Go's
/// keys (`{prefix}/write/{unix nanos}`, `{prefix}/read/{unix nanos}` under its own lease, as
/// `newUniqueEphemeralKey` does) contends with ours on one queue. Here that client is emulated
/// with raw etcd requests (no Go toolchain on the test machines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_recipes_rwmutex_layout() {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("go_rwmutex");
    let s = Session::builder(f.etcd().clone())
        .namespace(&ns)
        .start()
        .await
        .unwrap();
    let mut client = f.etcd().client().clone();
    let lease = client.lease_grant(30, None).await.unwrap().id();
    let go_key = |role: &str| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        format!("{ns}/doc/{role}/{nanos}")
    };
    // Go's putNewKV: create only if absent, with the session's lease.
    let put_new = async |key: &str| {
        let mut client = f.etcd().client().clone();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                "",
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let resp = client.txn(txn).await.unwrap();
        assert!(resp.succeeded());
        resp.header().unwrap().revision() as u64
    };
    let l = s.rwlock("doc").unwrap();
    // A Go writer holds: our reader and writer wait.
    let w = go_key("write");
    let w_rev = put_new(&w).await;
    assert!(l.try_read().await.unwrap().is_none());
    assert!(l.try_write().await.unwrap().is_none());
    let reader = tokio::spawn({
        let l = s.rwlock("doc").unwrap();
        async move { l.read().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!reader.is_finished(), "our reader waits for Go's writer");
    client.delete(w.as_str(), None).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(r.token().get() > w_rev);
    assert!(r.key().starts_with(&format!("{ns}/doc/read/")));
    // A Go reader reads beside ours; our writer waits for both.
    let gr = go_key("read");
    put_new(&gr).await;
    let writer = tokio::spawn({
        let l = s.rwlock("doc").unwrap();
        async move { l.write().await }
    });
    r.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "our writer waits for Go's reader");
    client.delete(gr.as_str(), None).await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(w.key().starts_with(&format!("{ns}/doc/write/")));
    // What a Go reader checks (any key under `{prefix}/write` with a lower revision) sees ours.
    let seen = client
        .get(
            format!("{ns}/doc/write"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(seen.kvs().len(), 1);
    w.release().await.unwrap();
    client.lease_revoke(lease).await.unwrap();
    s.close().await.unwrap();
}

/// A session whose lease an operator revoked is lost at the first request that finds it gone:
/// the request fails with `SessionLost(Expired)`, and from then on the session says
/// `Lost(Expired)` and its guards are not held. Before, `state()` said `Live` and the guard
/// `is_held()` until the next heartbeat (up to a third of the TTL: 0.66 s after another
/// session had been granted the lock, black-box round 35).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_lost_at_the_first_request_that_finds_it() {
    use fencelock::{SessionEnd, SessionState};
    let Some((f, s, held)) = holding("revoked").await else {
        return;
    };
    revoke(&f, &s).await;
    let r = s.mutex("next").unwrap().try_lock().await;
    assert!(
        matches!(r, Err(Error::SessionLost(SessionEnd::Expired))),
        "{r:?}"
    );
    assert_eq!(s.state(), SessionState::Lost(SessionEnd::Expired));
    assert!(!held.is_held());
    assert_eq!(
        held.lost().await,
        fencelock::LostReason::Session(SessionEnd::Expired)
    );
    let _ = s.close().await;
}

/// A holder awaiting `lost()` when an operator revokes its session's lease (which deletes
/// every key attached to it) learns that its session expired, not that someone deleted its
/// entry ("our entry was deleted by someone else", black-box round 35), and the session is
/// `Lost(Expired)` from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_reaches_lost_as_the_session_expired() {
    use fencelock::{LostReason, SessionEnd, SessionState};
    let Some((f, s, held)) = holding("revoked_lost").await else {
        return;
    };
    let lost = tokio::spawn(held.lost());
    revoke(&f, &s).await;
    let why = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost() fires")
        .unwrap();
    assert_eq!(why, LostReason::Session(SessionEnd::Expired));
    assert_eq!(s.state(), SessionState::Lost(SessionEnd::Expired));
    let _ = s.close().await;
}

/// A session of a long TTL (no heartbeat finds a revocation first) holding the mutex `held`
/// in a namespace of its own named after `test`; `None` where etcd is missing.
async fn holding(test: &str) -> Option<(EtcdFactory, Session, fencelock::Guard)> {
    let f = EtcdFactory::shared().await?;
    let s = Session::builder(f.etcd().clone())
        .namespace(fencelock::conformance::unique_namespace(test))
        .ttl(Duration::from_secs(60))
        .start()
        .await
        .unwrap();
    let held = s.mutex("held").unwrap().lock().await.unwrap();
    Some((f, s, held))
}

/// Revokes `s`'s lease, as an operator's `etcdctl lease revoke` does.
async fn revoke(f: &EtcdFactory, s: &Session) {
    let lease = i64::from_str_radix(&s.id(), 16).unwrap();
    f.etcd().client().clone().lease_revoke(lease).await.unwrap();
}

/// A key under a lock's prefix that is not UTF-8 (written by hand) holds the lock up like any
/// other entry, and its waiter looks again at a bounded rate: read lossily, its name never
/// existed, and the waiter read the queue again without a pause (thousands of txns a second).
/// Counted by the server itself, on a member of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_that_is_not_utf8_is_waited_for_without_spinning() {
    use etcd_client::PutOptions;
    use fencelock_integration::notifications::etcd_counter;
    use fencelock_integration::servers::etcd::{self as etcd_harness, EtcdCluster};
    use fencelock_integration::servers::{available, Cluster};
    use fencelock_integration::target::Kind;
    if !available(Kind::Etcd) {
        return;
    }
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .unwrap();
    let ep = cluster.endpoint(0);
    let b = etcd_harness::connect(std::slice::from_ref(&ep)).await;
    let s = Session::builder(b.clone())
        .namespace("bytes")
        .start()
        .await
        .unwrap();
    let mut client = b.client().clone();
    let lease = client.lease_grant(60, None).await.unwrap().id();
    let mut key = b"bytes/x/".to_vec();
    key.push(0xff);
    client
        .put(key, "", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    let txns = || etcd_counter(&ep, "grpc_server_handled_total", "grpc_method=\"Txn\"");
    let before = txns().await.expect("the server's counter");
    let waited = s
        .mutex("x")
        .unwrap()
        .lock_timeout(Duration::from_secs(2))
        .await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    let sent = txns().await.expect("the server's counter") - before;
    // A look every 250 ms: about 8 reads and a few requests of the enqueue and its removal.
    assert!(sent <= 40.0, "{sent} txns in 2 s of waiting");
    // Once the key goes, the waiter is granted.
    client.lease_revoke(lease).await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), s.mutex("x").unwrap().lock())
        .await
        .expect("granted once the foreign key is gone")
        .unwrap();
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// A multi-lock's `try_lock` takes a free set while locks nested under its names (`a/b` under
/// `a`) come and go: the all-or-nothing create compares the whole prefix, so each nested
/// change failed a try, and after three the free set was reported taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_try_ignores_nested_churn() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("nested_churn");
    let start = || {
        Session::builder(f.etcd().clone())
            .namespace(ns.as_str())
            .start()
    };
    let (a, b) = (start().await.unwrap(), start().await.unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = tokio::spawn({
        let (b, stop) = (b.clone(), stop.clone());
        async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let g = b.mutex("a/b").unwrap().lock().await.unwrap();
                g.release().await.unwrap();
                n += 1;
            }
            n
        }
    });
    let mut refused = 0;
    for _ in 0..50 {
        match a.multi_lock(["a", "c"]).unwrap().try_lock().await.unwrap() {
            Some(g) => g.release().await.unwrap(),
            None => refused += 1,
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let churned = churn.await.unwrap();
    assert!(churned >= 20, "the nested lock barely churned: {churned}");
    assert_eq!(
        refused, 0,
        "free sets refused (nested lock taken {churned} times)"
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// An etcd URL that names another service (here a plain HTTP server) is a setting to fix,
/// `InvalidConfig`: the HTTP/2 protocol error it answers with was an internal failure
/// (`Error::Backend`, the CLI's 70).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_is_not_etcd_is_a_wrong_setting() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    .await;
                // Closed in order (what the client sends meanwhile read to its end): a reset
                // would be a temporary error instead.
                let _ = conn.shutdown().await;
                while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    // Named as given (without a scheme here, the client's form has `http://`).
    let config = EtcdConfig::new([addr.to_string()]).connect_timeout(Duration::from_secs(3));
    let r = tokio::time::timeout(Duration::from_secs(10), EtcdBackend::connect_with(config))
        .await
        .expect("an answer within the bound");
    assert!(
        matches!(&r, Err(Error::InvalidConfig(i)) if i.input == addr.to_string()),
        "{r:?}"
    );
    // Listed beside a member that answers, first: left out, as an unreachable one (it failed
    // the whole connect).
    if let Some(f) = EtcdFactory::shared().await {
        use fencelock_integration::servers::Cluster;
        let config = EtcdConfig::new([format!("http://{addr}"), f.cluster.endpoint(0)])
            .connect_timeout(Duration::from_secs(3));
        let backend =
            tokio::time::timeout(Duration::from_secs(10), EtcdBackend::connect_with(config))
                .await
                .expect("an answer within the bound")
                .unwrap();
        // And it stays out (the endpoint monitor, every half second, took its answer for a
        // member's and put it back: requests failed there).
        let s = Session::builder(backend)
            .namespace(fencelock::conformance::unique_namespace("not_etcd"))
            .start()
            .await
            .unwrap();
        let until = tokio::time::Instant::now() + Duration::from_secs(3);
        let mut rounds = 0;
        while tokio::time::Instant::now() < until {
            s.mutex("m")
                .unwrap()
                .lock()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
            rounds += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(rounds >= 10, "{rounds} rounds");
        s.close().await.unwrap();
    }
    server.abort();
}

/// A cluster past its space quota (the NOSPACE alarm) refuses what adds data with
/// [`Error::OutOfSpace`], at once (a wait does not retry it): a new session, a new entry. What
/// exists lives on: the session's heartbeats go on for several TTLs, and its lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_space_quota_sessions_live_and_new_entries_are_refused() {
    use fencelock_integration::servers::etcd::{self as harness, EtcdCluster, EtcdOptions};
    use fencelock_integration::servers::Cluster;
    if harness::shared().is_none() {
        return;
    }
    let options = EtcdOptions {
        quota_bytes: Some(256 << 10),
        ..Default::default()
    };
    let cluster = tokio::task::spawn_blocking(move || EtcdCluster::start_with(1, options))
        .await
        .unwrap();
    let ep = cluster.endpoint(0);
    let connect = || EtcdBackend::connect([ep.as_str()]);
    let ttl = Duration::from_secs(2);
    let s = Session::builder(connect().await.unwrap())
        .ttl(ttl)
        .start()
        .await
        .unwrap();
    let g = s.mutex("held").unwrap().lock().await.unwrap();
    // Filled past the quota. etcd compares the quota with the size of its backend as of the
    // last commit of its batch (every 100 ms): puts faster than that are all taken before the
    // first refusal (CI run 63: 64 puts of 64 KiB, four times the quota, none refused). Bounded
    // by count: 1,024 puts, 64 MiB, far more than a batch interval of puts.
    let mut client = etcd_client::Client::connect([ep.as_str()], None)
        .await
        .unwrap();
    let mut refused = None;
    for i in 0..1024 {
        if let Err(e) = client
            .put(format!("fill/{i}"), vec![b'x'; 64 << 10], None)
            .await
        {
            refused = Some(e);
            break;
        }
    }
    let refused = refused.expect("the quota was reached");
    assert!(refused.to_string().contains("space exceeded"), "{refused}");
    let out_of_space = |r: &fencelock::Result<()>| matches!(r, Err(Error::OutOfSpace { .. }));
    let within = Duration::from_secs(10);
    let lock = tokio::time::timeout(within, s.mutex("new").unwrap().lock())
        .await
        .expect("a lock at the quota returns at once")
        .map(drop);
    assert!(out_of_space(&lock), "{lock:?}");
    let start = tokio::time::timeout(within, async {
        Session::builder(connect().await?).ttl(ttl).start().await
    })
    .await
    .expect("a session start at the quota returns")
    .map(drop);
    assert!(out_of_space(&start), "{start:?}");
    // Several TTLs of heartbeats at the quota: the session and its lock stay.
    let lost = tokio::time::timeout(ttl * 4, s.lost()).await;
    assert!(lost.is_err(), "the session ended at the quota: {lost:?}");
    g.release().await.expect("a release at the quota");
    s.close().await.unwrap();
}
