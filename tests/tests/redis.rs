//! The conformance suite and Redis-specific behaviour against a real `redis-server` started by
//! the harness.

use std::time::Duration;

use fencelock::{Error, Session};
use fencelock_integration::servers::redis::RedisFactory;
use fencelock_redis::{RedisBackend, RedisConfig};

fencelock::conformance_tests!(RedisFactory::shared());

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
    for bad in ["redis://[::1", "rediss://127.0.0.1:1", "http://x"] {
        let r = RedisBackend::connect(bad).await;
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{bad}: {r:?}");
    }
    let r = RedisConfig::new("127.0.0.1:1")
        .timeout(Duration::MAX)
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
