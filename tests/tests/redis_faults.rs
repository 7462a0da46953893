//! Faults with a real Redis server: a leader killed in another process (SIGKILL), a leader and
//! a lock holder cut off by a proxy past their TTL, a holder paused (SIGSTOP) past its TTL whose
//! guarded write Redis refuses.

use std::sync::Arc;
use std::time::Duration;

use fencelock_integration::servers::redis::{self, RedisServer};
use fencelock_integration::target::{Kind, Target};

async fn target() -> Option<(Arc<RedisServer>, Target)> {
    let s = redis::shared()?;
    let t = Target::new(Kind::Redis, s.addr());
    Some((s, t))
}

fencelock_integration::fault_tests!(
    target(),
    Duration::from_secs(2),
    env!("CARGO_BIN_EXE_holder")
);

/// A server that goes silent on a new connection (killed, and its port taken by a listener that
/// accepts and never answers): a request still ends within `RedisConfig::timeout`, as
/// documented. The connection manager made it wait for its reconnect first (two connects of the
/// timeout each and a backoff), about three times as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_a_server_gone_silent_ends_within_the_timeout() {
    use fencelock::backend::Backend;
    use fencelock_integration::servers::available;
    use fencelock_integration::servers::redis::Durability;
    if !available(Kind::Redis) {
        return;
    }
    let server = RedisServer::start(Durability::None);
    let timeout = Duration::from_secs(1);
    let backend = fencelock_redis::RedisConfig::new(format!("redis://{}", server.addr()))
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    let remote = backend.open_session(Duration::from_secs(30)).await.unwrap();
    remote.keep_alive().await.unwrap();
    server.kill();
    // Nothing answers on the port now; the kernel still completes the connections.
    let _silent = std::net::TcpListener::bind(("127.0.0.1", server.port())).unwrap();
    for _ in 0..3 {
        let start = std::time::Instant::now();
        let r = remote.keep_alive().await;
        let took = start.elapsed();
        assert!(r.is_err(), "a silent server answered");
        assert!(
            took < timeout + Duration::from_millis(500),
            "a request took {took:?} (timeout {timeout:?}): {r:?}"
        );
    }
}
