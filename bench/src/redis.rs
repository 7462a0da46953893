//! The Redis rows of the benchmark (`src/main.rs`), side by side in one run against one
//! local `redis-server` started here:
//!
//! 1. uncontended acquire + release latency of our `Mutex` on Redis, of a bare `SET NX PX` +
//!    compare-and-delete script (the floor: one round trip each, no queue, no session), of
//!    `rslock` (the popular Rust Redlock crate, here on one server) and of our [`Redlock`] on
//!    one server, interleaved in blocks;
//! 2. contended acquisitions per second with N sessions (one connection each): ours (a FIFO
//!    queue, waiters woken by pub/sub) against `rslock`'s `acquire` (retries after its delay,
//!    here 1 ms) in alternating pairs of slices, and the bare `SET NX PX` retried after 1 ms.

use std::sync::Arc;
use std::time::Duration;

use fencelock::Session;
use fencelock_redis::RedisConnection;
use fencelock_redis::{RedisBackend, Redlock};

use super::{ms, run_slice, time_interleaved, Args, Contended, Op};
use fencelock_integration::servers::redis::{self as harness, Durability, RedisServer};

/// The lock TTL of the bare and rslock rows, and our session TTL.
pub(crate) const TTL: Duration = Duration::from_secs(10);

/// The floor: `SET key token NX PX ttl`, then a compare-and-delete script; retried after
/// `retry` while taken (contended rows).
pub(crate) fn bare_op(con: RedisConnection, key: &'static str, retry: Duration) -> Op {
    static DELETE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        )
    });
    Box::new(move || {
        let mut con = con.clone();
        Box::pin(async move {
            let token = uuid::Uuid::new_v4().simple().to_string();
            loop {
                let set: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async(&mut con)
                    .await
                    .expect("SET NX PX");
                if set.is_some() {
                    break;
                }
                tokio::time::sleep(retry).await;
            }
            let _: i64 = DELETE
                .key(key)
                .arg(&token)
                .invoke_async(&mut con)
                .await
                .expect("delete");
        })
    })
}

/// `rslock`: `acquire` (loops over `lock`, retrying after its delay) + `unlock`.
pub fn rslock_op(url: &str, resource: &'static str) -> Op {
    rslock_op_with(
        Arc::new(rslock_with(url, Duration::from_millis(1))),
        resource,
    )
}

/// An `rslock` manager of the server at `url`, or of the cluster of a `redis+cluster://` URL
/// (its cluster client), retrying after `retry`.
pub(crate) fn rslock_with(url: &str, retry: Duration) -> rslock::LockManager {
    let mut lm = match url.strip_prefix("redis+cluster://") {
        Some(nodes) => {
            let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
            rslock::LockManager::new_cluster(nodes).expect("rslock cluster")
        }
        None => rslock::LockManager::new(vec![url.to_string()]),
    };
    lm.set_retry(u32::MAX, retry);
    lm
}

/// [`rslock_op`] with a manager of its own.
pub(crate) fn rslock_op_with(lm: Arc<rslock::LockManager>, resource: &'static str) -> Op {
    Box::new(move || {
        let lm = lm.clone();
        Box::pin(async move {
            let lock = lm
                .acquire_no_guard(resource.as_bytes(), TTL)
                .await
                .expect("rslock");
            lm.unlock(&lock).await;
        })
    })
}

/// Our `Mutex` lock + release, on a session of its own over `backend`.
pub async fn our_op(backend: RedisBackend, name: &str) -> Op {
    let s = Session::builder(backend)
        .namespace("bench")
        .ttl(TTL)
        .start()
        .await
        .expect("session");
    let m = Arc::new(s.mutex(name).expect("mutex"));
    Box::new(move || {
        let (m, _s) = (m.clone(), s.clone());
        Box::pin(async move {
            let g = m.lock().await.expect("lock");
            g.release().await.expect("release");
        })
    })
}

/// Measures and prints the contended row of `n` sessions (one per backend of `backends`): ours
/// and rslock's (on `url`, a server or a cluster) side by side in alternating pairs of slices,
/// then the bare loop; returns the pair and the bare loop's figures.
pub(crate) async fn contended_row(
    n: usize,
    seconds: f64,
    backends: Vec<RedisBackend>,
    url: &str,
) -> (super::Pair, Contended) {
    let (mut ours, mut bare, mut rs) = (Vec::new(), Vec::new(), Vec::new());
    for b in backends {
        ours.push(our_op(b.clone(), "contended").await);
        bare.push(bare_op(
            b.connection(),
            "bench:bare-contended",
            Duration::from_millis(1),
        ));
        rs.push(rslock_op(url, "bench:rslock-contended"));
    }
    let pair = super::throughput_pair(ours, rs, seconds).await;
    let (per, secs, _) = run_slice(bare, (seconds / 2.0).max(0.5)).await;
    let bare = Contended::of(&per, secs);
    crate::emit!(
        "| {n} | {:.0} ({:.2}) | {:.0} ({:.2}) | {:.0} ({:.2}) | {} |",
        pair.a.rate,
        pair.a.fairness,
        pair.b.rate,
        pair.b.fairness,
        bare.rate,
        bare.fairness,
        super::spread(&pair.ratios(), "x")
    );
    (pair, bare)
}

/// Prints the Redis rows; skips them if `redis-server` is not installed.
pub async fn redis_rows(args: &Args) {
    if harness::missing().is_some() {
        crate::emit!("\n(Redis not installed: skipped)");
        return;
    }
    let server = tokio::task::spawn_blocking(|| RedisServer::start(Durability::None))
        .await
        .expect("start redis");
    let url = server.url();
    crate::emit!(
        "\n## Redis (single server, {}, no persistence)\n",
        server.addr()
    );
    crate::emit!(
        "Uncontended acquire + release, {} rounds (interleaved in blocks of 50):\n",
        args.rounds
    );
    super::latency_header("bare SET NX PX");
    let backend = server.backend().await;
    let redlock = Redlock::connect([url.as_str()]).expect("redlock");
    let redlock_op: Op = Box::new(move || {
        let r = redlock.clone();
        Box::pin(async move {
            let g = r
                .try_lock("bench/redlock", TTL)
                .await
                .expect("redlock")
                .expect("uncontended");
            g.release().await.expect("release");
        })
    });
    let mut ops = [
        our_op(backend.clone(), "ours").await,
        bare_op(backend.connection(), "bench:bare", Duration::from_millis(1)),
        rslock_op(&url, "bench:rslock"),
        redlock_op,
    ];
    let samples = time_interleaved(args.rounds, &mut ops).await;
    super::latency_rows(
        &[
            "fencelock Mutex lock + release",
            "bare SET NX PX + delete script",
            "rslock lock + unlock (one server)",
            "fencelock_redis::Redlock (one server)",
        ],
        &samples,
        1,
    );
    super::summary("Redis", "uncontended p50 ms", ms(samples[0].pct(0.5)));

    crate::emit!(
        "\nContended acquisitions per second (ours and rslock's side by side, {} s each in {} alternating pairs of slices; the bare loop after them, {} s; one connection per session):\n",
        args.seconds,
        super::PAIRS,
        args.seconds / 2.0
    );
    crate::emit!("Each cell: acquisitions per second, and in brackets the fewest acquisitions of one session");
    crate::emit!(
        "as a share of the most (1.00: every session served alike; near 0: some starved).\n"
    );
    crate::emit!("| sessions | fencelock Mutex | rslock, retry 1 ms | bare SET NX PX, retry 1 ms | ours vs rslock: median of the pairs (least–greatest) |");
    crate::emit!("|---:|---:|---:|---:|---:|");
    for &n in &args.sessions {
        let mut backends = Vec::new();
        for _ in 0..n {
            backends.push(server.backend().await);
        }
        let (pair, bare) = contended_row(n, args.seconds, backends, &url).await;
        let rates = [pair.a.rate, bare.rate, pair.b.rate];
        super::summary(
            "Redis",
            &format!("{n} sessions acq/s"),
            format!("{:.0}", rates[0]),
        );
        super::report::define(
            "redis-throughput",
            "Redis: contended acquisitions per second",
            "contending sessions",
            "acquisitions/s",
            true,
        );
        for (series, r) in ["fencelock Mutex", "bare SET NX PX", "rslock"]
            .iter()
            .zip(&rates)
        {
            super::report::point("redis-throughput", series, n as f64, *r);
        }
    }
    drop(server);
}
