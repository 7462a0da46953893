//! What an asynchronous failover does to Redis locks, shown step by step (the adversity suite
//! shows it statistically), and what `wait_for_replicas` changes. A primary and its replica
//! stand behind a proxy that moves to the replica when it is promoted (`REPLICAOF NO ONE`).

use std::time::Duration;

use fencelock::{Error, Fence, Session};
use fencelock_integration::proxy::Proxy;
use fencelock_integration::servers::redis::{self, RedisServer};
use fencelock_redis::{RedisBackend, RedisConfig};

const TTL: Duration = Duration::from_secs(10);
const WITHIN: Duration = Duration::from_secs(20);

struct Pair {
    primary: RedisServer,
    replica: RedisServer,
    front: Proxy,
}

async fn pair() -> Option<Pair> {
    if !redis::available() {
        return None;
    }
    let (primary, replica) = tokio::task::spawn_blocking(|| {
        let p = RedisServer::start(redis::Durability::None);
        let r = RedisServer::replica_of(&p);
        (p, r)
    })
    .await
    .unwrap();
    wait_in_sync(&replica).await;
    let front = Proxy::start(&primary.addr()).await;
    Some(Pair {
        primary,
        replica,
        front,
    })
}

/// Waits (bounded) until `replica` is in sync with its primary.
async fn wait_in_sync(replica: &RedisServer) {
    let start = std::time::Instant::now();
    while !replica
        .cli(&["INFO", "replication"])
        .unwrap_or_default()
        .contains("master_link_status:up")
    {
        assert!(start.elapsed() < WITHIN, "the replica did not sync");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Pair {
    /// Kills the primary, promotes the replica, and moves the address to it.
    fn fail_over(&self) {
        tokio::task::block_in_place(|| {
            self.primary.kill();
            self.replica.resume();
            self.replica.promote();
        });
        self.front.retarget(&self.replica.addr());
    }
}

async fn session(backend: RedisBackend) -> Session {
    Session::builder(backend).ttl(TTL).start().await.unwrap()
}

/// The replica lags (paused) while a holder is granted on the primary; the primary dies and
/// the replica is promoted without the holder's entry and without the last counter increments:
/// a second client is granted the lock while the first still holds it (a double grant), with a
/// *smaller* token, so a fenced resource refuses the new holder and keeps accepting the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_failover_grants_twice_and_inverts_the_tokens() {
    let Some(p) = pair().await else { return };
    let backend = RedisBackend::connect(p.front.addr()).await.unwrap();
    let a = session(backend.clone()).await;
    let m = a.mutex("failover").unwrap();
    tokio::task::block_in_place(|| p.replica.pause());
    for _ in 0..5 {
        m.lock().await.unwrap().release().await.unwrap();
    }
    let held_by_a = m.lock().await.unwrap();
    let fence = Fence::new();
    fence.admit(held_by_a.token()).unwrap();

    p.fail_over();

    let b = session(backend.clone()).await;
    let held_by_b = tokio::time::timeout(WITHIN, b.mutex("failover").unwrap().lock())
        .await
        .expect("the promoted replica grants the lock: it never saw A's entry")
        .unwrap();
    assert!(
        held_by_a.is_held() && held_by_b.is_held(),
        "double grant: A and B both hold the lock"
    );
    assert!(
        held_by_b.token() < held_by_a.token(),
        "the counter lost A's increments: B's token {} is below A's {}",
        held_by_b.token(),
        held_by_a.token()
    );
    assert!(
        fence.admit(held_by_b.token()).is_err(),
        "the resource refuses the new holder"
    );
    assert!(
        fence.admit(held_by_a.token()).is_ok(),
        "and keeps accepting the old one"
    );
    println!(
        "asynchronous failover: A holds token {}, B granted token {} at the same time; the fence refused B",
        held_by_a.token(),
        held_by_b.token()
    );
    drop((held_by_a, held_by_b));
    let _ = a.close().await;
    let _ = b.close().await;
}

/// With `wait_for_replicas(1, …)` no grant completes until the replica has it: while the
/// replica lags, acquisitions time out; once it caught up, a grant survives the failover, the
/// second client waits, and tokens keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_grants_survive_failover() {
    let Some(p) = pair().await else { return };
    let backend = RedisConfig::new(p.front.addr())
        .wait_for_replicas(1, Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let a = session(backend.clone()).await;
    let m = a.mutex("failover").unwrap();
    tokio::task::block_in_place(|| p.replica.pause());
    let r = m.lock_timeout(Duration::from_secs(1)).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "no grant without the replica's acknowledgement: {r:?}"
    );
    tokio::task::block_in_place(|| p.replica.resume());
    let held_by_a = tokio::time::timeout(WITHIN, m.lock())
        .await
        .expect("granted once the replica acknowledges")
        .unwrap();

    tokio::task::block_in_place(|| p.replica.pause());
    p.fail_over();
    // The old primary comes back as the new primary's replica, so that grants can be
    // acknowledged again.
    tokio::task::block_in_place(|| p.primary.restart_as(Some(p.replica.port())));
    wait_in_sync(&p.primary).await;

    let b = session(backend.clone()).await;
    let mb = b.mutex("failover").unwrap();
    let r = mb.lock_timeout(Duration::from_secs(1)).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "the promoted replica has A's entry: B waits ({r:?})"
    );
    assert!(held_by_a.is_held());
    let token_a = held_by_a.token();
    tokio::time::timeout(WITHIN, held_by_a.release())
        .await
        .expect("release after the failover")
        .unwrap();
    let held_by_b = tokio::time::timeout(WITHIN, mb.lock())
        .await
        .expect("B is granted after A released")
        .unwrap();
    assert!(held_by_b.token() > token_a, "tokens keep increasing");
    held_by_b.release().await.unwrap();
    let _ = a.close().await;
    let _ = b.close().await;
}
