//! What an asynchronous failover does to Redis locks, shown step by step (the adversity suite
//! shows it statistically), and what `wait_for_replicas` changes. A primary and its replica
//! stand behind a proxy that moves to the replica when it is promoted (`REPLICAOF NO ONE`).

use std::time::Duration;

use fencelock::{Error, Fence, Session};
use fencelock_integration::proxy::{Mode, Proxy};
use fencelock_integration::servers::redis::{self, RedisServer};
use fencelock_redis::{RedisBackend, RedisConfig};

const TTL: Duration = Duration::from_secs(10);
const WITHIN: Duration = Duration::from_secs(20);

struct Pair {
    primary: RedisServer,
    replica: RedisServer,
    /// The replication link (replica → primary), which the tests cut.
    link: Proxy,
    /// Where clients connect: follows the primary.
    front: Proxy,
}

async fn pair() -> Option<Pair> {
    if !redis::available() {
        return None;
    }
    let primary = tokio::task::spawn_blocking(|| RedisServer::start(redis::Durability::None))
        .await
        .unwrap();
    let link = Proxy::start(&primary.addr()).await;
    let port = link.port();
    let replica = tokio::task::spawn_blocking(move || {
        let r = RedisServer::replica_via(port, redis::Durability::None);
        r.wait_in_sync();
        r
    })
    .await
    .unwrap();
    let front = Proxy::start(&primary.addr()).await;
    Some(Pair {
        primary,
        replica,
        link,
        front,
    })
}

impl Pair {
    /// The replica stops receiving the primary's writes (they wait in the link).
    fn lag(&self) {
        self.link.set(Mode::BlackHole);
    }

    /// A backend on the pair whose grants and heartbeats wait for the replica's
    /// acknowledgement.
    async fn replicated(&self) -> RedisBackend {
        RedisConfig::new(self.front.addr())
            .wait_for_replicas(1, Duration::from_millis(200))
            .connect()
            .await
            .unwrap()
    }

    /// Waits (bounded) until the replica has processed every write the primary has made.
    fn caught_up(&self) {
        let offset = |server: &RedisServer, field: &str| -> i64 {
            let info = server.cli(&["INFO", "replication"]).unwrap_or_default();
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(-1)
        };
        let target = offset(&self.primary, "master_repl_offset:");
        assert!(
            target >= 0,
            "the primary's replication offset could not be read"
        );
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while offset(&self.replica, "slave_repl_offset:") < target {
            assert!(
                std::time::Instant::now() < until,
                "the replica never caught up with offset {target}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The replica receives what it missed.
    fn catch_up(&self) {
        self.link.set(Mode::Pass);
    }

    /// Kills the primary, promotes the replica (with whatever it has), and moves the address
    /// to it.
    fn fail_over(&self) {
        tokio::task::block_in_place(|| {
            self.primary.kill();
            self.replica.promote();
        });
        self.front.retarget(&self.replica.addr());
    }
}

async fn session(backend: RedisBackend) -> Session {
    Session::builder(backend).ttl(TTL).start().await.unwrap()
}

/// The replica lags (its link cut) while a holder is granted on the primary; the primary dies and
/// the replica is promoted without the holder's entry and without the last counter increments:
/// a second client is granted the lock while the first still holds it (a double grant), with a
/// *smaller* token, so a fenced resource refuses the new holder and keeps accepting the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_failover_grants_twice_and_inverts_the_tokens() {
    let Some(p) = pair().await else { return };
    let backend = RedisBackend::connect(p.front.addr()).await.unwrap();
    let a = session(backend.clone()).await;
    let m = a.mutex("failover").unwrap();
    p.lag();
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
    let backend = p.replicated().await;
    // A long TTL: the holder's heartbeats are acknowledged by the replica too, and while the
    // old primary comes back as a replica none is; the holder must not reach its local
    // deadline meanwhile (see `replicated_heartbeats_bound_the_deadline`).
    let a = Session::builder(backend.clone())
        .ttl(Duration::from_secs(60))
        .start()
        .await
        .unwrap();
    let m = a.mutex("failover").unwrap();
    p.lag();
    let r = m.lock_timeout(Duration::from_secs(1)).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "no grant without the replica's acknowledgement: {r:?}"
    );
    p.catch_up();
    let held_by_a = tokio::time::timeout(WITHIN, m.lock())
        .await
        .expect("granted once the replica acknowledges")
        .unwrap();

    p.lag();
    p.fail_over();
    // The old primary comes back as the new primary's replica, so that grants can be
    // acknowledged again.
    tokio::task::block_in_place(|| {
        p.primary.restart_as(Some(p.replica.port()));
        p.primary.wait_in_sync();
    });

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

/// With `wait_for_replicas`, a heartbeat counts only once the replica has it: a holder whose
/// replica stopped following loses its lock at its local deadline, while the replica's copy of
/// its session is still alive — so a failover to that replica can never grant the lock to
/// someone else before the holder has stepped down. (Without acknowledged heartbeats the
/// primary keeps confirming the holder, which holds on while the replica's copy expires.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_heartbeats_bound_the_deadline() {
    let Some(p) = pair().await else { return };
    let backend = p.replicated().await;
    let ttl = Duration::from_secs(3);
    let a = Session::builder(backend).ttl(ttl).start().await.unwrap();
    let held = a.mutex("deadline").unwrap().lock().await.unwrap();
    p.lag();
    let reason = tokio::time::timeout(WITHIN, held.lost())
        .await
        .expect("the holder steps down while its heartbeats go unacknowledged");
    assert_eq!(
        reason,
        fencelock::LostReason::Session(fencelock::SessionEnd::LocalDeadline)
    );
    let pttl = tokio::task::block_in_place(|| {
        p.replica
            .cli(&["PTTL", &format!("fencelock:s:{}", a.id())])
            .unwrap()
    });
    let pttl: i64 = pttl.trim().parse().unwrap();
    assert!(
        pttl > 0,
        "the replica's copy of the session was alive when the holder stepped down ({pttl} ms left)"
    );
    p.catch_up();
}

/// A release lost in the failover brings the released entry back on the promoted replica, owned
/// by a session that is still alive: its heartbeat finds that the server went back in time,
/// and deletes what it does not own any more, so that the lock does not stay blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_entry_that_came_back_is_deleted() {
    let Some(p) = pair().await else { return };
    let backend = RedisBackend::connect(p.front.addr()).await.unwrap();
    let ttl = Duration::from_secs(3);
    let a = Session::builder(backend.clone())
        .ttl(ttl)
        .start()
        .await
        .unwrap();
    let m = a.mutex("ghost").unwrap();
    let held = m.lock().await.unwrap();
    // Replicated: the replica has A's entry.
    tokio::task::block_in_place(|| p.caught_up());
    p.lag();
    held.release().await.unwrap();
    p.fail_over();

    let b = session(backend.clone()).await;
    let start = std::time::Instant::now();
    let g = b
        .mutex("ghost")
        .unwrap()
        .lock_timeout(ttl * 3)
        .await
        .expect("the entry A released is deleted by A's session once it sees the failover");
    println!("granted {:?} after the failover", start.elapsed());
    g.release().await.unwrap();
    let _ = a.close().await;
    let _ = b.close().await;
}

/// Sessions of one backend with `wait_for_replicas` over a slow replication link (each `WAIT`
/// a few hundred ms) all stay live: each session's acknowledged heartbeats go on a connection
/// of its own. On one connection shared by the backend's sessions, a `WAIT` blocks the
/// connection, so the heartbeats of sixteen sessions waited one behind another, past their
/// patience (a third of the TTL), and the sessions were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_heartbeats_of_many_sessions_do_not_queue() {
    let Some(p) = pair().await else { return };
    p.link.set(Mode::Delay(Duration::from_millis(70)));
    let backend = RedisConfig::new(p.front.addr())
        .wait_for_replicas(1, Duration::from_millis(600))
        .connect()
        .await
        .unwrap();
    let ttl = Duration::from_secs(3);
    let mut sessions = Vec::new();
    for _ in 0..16 {
        sessions.push(
            Session::builder(backend.clone())
                .ttl(ttl)
                .start()
                .await
                .unwrap(),
        );
    }
    // Two TTLs: six heartbeats each.
    let until = tokio::time::Instant::now() + 2 * ttl;
    while tokio::time::Instant::now() < until {
        for s in &sessions {
            assert!(
                !matches!(s.state(), fencelock::SessionState::Lost(_)),
                "session {} lost: {:?}",
                s.id(),
                s.state()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in sessions {
        s.close().await.unwrap();
    }
    p.catch_up();
}

/// The same lost release, with a waiter that the release granted (on the old primary) and the
/// releasing session locking again at once, before its heartbeat: on the promoted replica the
/// released entry is back at the head, the waiter's behind it. The session's new lock is a new
/// entry behind the waiter's, not the one that came back: it waits while the waiter holds.
/// (A review: `create` took the entry that came back for a retry of its own, with its old
/// token, and granted it beside the waiter.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locking_again_after_a_lost_release_waits_behind_its_grantee() {
    let Some(p) = pair().await else { return };
    let backend = RedisBackend::connect(p.front.addr()).await.unwrap();
    let (a, b) = (
        session(backend.clone()).await,
        session(backend.clone()).await,
    );
    let held = a.mutex("ghost").unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let m = b.mutex("ghost").unwrap();
        async move { m.lock().await }
    });
    // B's entry queued, and replicated (the replica acknowledged every write so far).
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while b
        .mutex("ghost")
        .unwrap()
        .waiters()
        .await
        .unwrap()
        .is_empty()
    {
        assert!(std::time::Instant::now() < until, "B never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::task::block_in_place(|| p.caught_up());
    p.lag();
    held.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("B was never granted")
        .unwrap()
        .unwrap();
    p.fail_over();
    let again = a
        .mutex("ghost")
        .unwrap()
        .lock_timeout(Duration::from_secs(2))
        .await;
    assert!(
        matches!(again, Err(Error::Timeout { .. })),
        "A locked again beside B: {:?}",
        again.map(|g| g.token())
    );
    assert!(granted.is_held());
    granted.release().await.unwrap();
    let next = a
        .mutex("ghost")
        .unwrap()
        .lock_timeout(Duration::from_secs(10))
        .await
        .expect("A after B's release");
    assert!(next.token() > granted.token());
    next.release().await.unwrap();
    let _ = a.close().await;
    let _ = b.close().await;
}
