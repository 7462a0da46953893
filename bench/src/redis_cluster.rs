//! The Redis Cluster rows: a real cluster of three primaries and a replica each, on loopback.
//!
//! - Uncontended lock + release and contended acquisitions, ours, `rslock` (its cluster client)
//!   and a bare `SET NX PX` through the cluster client, as on one server.
//! - **Held locks across the shards**: a few sessions (one per backend, as one per process),
//!   each taking its share of `n` distinct locks with 64 acquisitions in flight, then holding
//!   them all for two TTLs: acquisitions and releases per second, client memory per held lock
//!   (the counting allocator), server memory per held lock (`used_memory` of the primaries
//!   before and after), the sessions still live and the script calls per second the servers
//!   run while the locks are held (the heartbeats: flat in the number of locks). `rslock` on
//!   the same cluster takes and releases the same number of locks alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::Session;
use fencelock_integration::servers::redis as harness;
use fencelock_integration::servers::redis_cluster::RedisCluster;
use futures::{stream, StreamExt};

use super::alloc::allocated;
use super::redis::{bare_op, our_op, rslock_with};
use super::{time_interleaved, Args};

/// Sessions (and rslock managers) sharing the held locks: one per process, a few processes.
const HOLDERS: usize = 4;

/// Acquisitions in flight per holder.
const IN_FLIGHT: usize = 64;

/// The TTL of the held-locks row: short, so that two TTLs of holding run many heartbeats.
const HELD_TTL: Duration = Duration::from_secs(6);

/// The sum of `field` of `INFO section` over the cluster's primaries.
fn info_sum(cluster: &RedisCluster, section: &str, field: &str) -> u64 {
    cluster
        .primaries()
        .into_iter()
        .map(|i| {
            let info = cluster.node(i).cli(&["INFO", section]).unwrap_or_default();
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{field}:")))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Script calls (`EVALSHA` and `EVAL`) the primaries have run.
fn script_calls(cluster: &RedisCluster) -> u64 {
    cluster
        .primaries()
        .into_iter()
        .map(|i| {
            let stats = cluster
                .node(i)
                .cli(&["INFO", "commandstats"])
                .unwrap_or_default();
            stats
                .lines()
                .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
                .filter_map(|l| {
                    let calls = l.split_once("calls=")?.1;
                    calls.split(',').next()?.parse::<u64>().ok()
                })
                .sum::<u64>()
        })
        .sum()
}

/// One held-locks row.
struct Held {
    rate: f64,
    release_rate: f64,
    client_bytes: Option<f64>,
    server_bytes: f64,
    /// Sessions live after holding for two TTLs (ours).
    live: Option<usize>,
    /// Script calls per second while holding.
    idle_calls: f64,
}

/// What taking `n` locks (`HOLDERS` holders, `IN_FLIGHT` at a time each) costs, measured the
/// same way for ours and rslock's: `take(holder, i)` takes lock `i` of `holder`.
struct Taken<T> {
    /// Per holder, what it took.
    held: Vec<Vec<T>>,
    rate: f64,
    client_bytes: Option<f64>,
    server_bytes: f64,
}

async fn take_all<T, Fut>(
    cluster: &Arc<RedisCluster>,
    n: usize,
    take: impl Fn(usize, usize) -> Fut + Sync,
) -> Taken<T>
where
    T: Send,
    Fut: std::future::Future<Output = T> + Send,
{
    let used = |c: Arc<RedisCluster>| async move {
        tokio::task::spawn_blocking(move || info_sum(&c, "memory", "used_memory"))
            .await
            .unwrap()
    };
    let server_before = used(cluster.clone()).await;
    let before = allocated();
    let start = Instant::now();
    let per = n / HOLDERS;
    let take = &take;
    let takes = (0..HOLDERS).map(|h| {
        stream::iter(0..per)
            .map(move |i| take(h, i))
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<T>>()
    });
    let held = futures::future::join_all(takes).await;
    let rate = (per * HOLDERS) as f64 / start.elapsed().as_secs_f64();
    let client_bytes = allocated()
        .zip(before)
        .map(|(a, b)| (a - b) as f64 / (per * HOLDERS) as f64);
    let server_after = used(cluster.clone()).await;
    Taken {
        held,
        rate,
        client_bytes,
        server_bytes: (server_after as f64 - server_before as f64) / (per * HOLDERS) as f64,
    }
}

/// Releases what each holder took with `release(holder, lock)`, `IN_FLIGHT` at a time each;
/// returns the rate.
async fn release_all<T, Fut>(held: Vec<Vec<T>>, release: impl Fn(usize, T) -> Fut + Sync) -> f64
where
    T: Send,
    Fut: std::future::Future<Output = ()> + Send,
{
    let n: usize = held.iter().map(Vec::len).sum();
    let start = Instant::now();
    let release = &release;
    let releases = held.into_iter().enumerate().map(|(h, locks)| {
        stream::iter(locks)
            .map(move |l| release(h, l))
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<()>>()
    });
    futures::future::join_all(releases).await;
    n as f64 / start.elapsed().as_secs_f64()
}

async fn held_ours(cluster: &Arc<RedisCluster>, n: usize) -> Held {
    let mut sessions = Vec::new();
    for _ in 0..HOLDERS {
        let backend = cluster.backend().await;
        sessions.push(
            Session::builder(backend)
                .namespace("bench-held")
                .ttl(HELD_TTL)
                .start()
                .await
                .expect("session"),
        );
    }
    let sessions = &sessions;
    let taken = take_all(cluster, n, |h, i| async move {
        sessions[h]
            .mutex(&format!("held/{h}/{i}"))
            .unwrap()
            .lock()
            .await
            .expect("lock")
    })
    .await;
    let c = cluster.clone();
    let calls_before = tokio::task::spawn_blocking(move || script_calls(&c))
        .await
        .unwrap();
    let idle = Instant::now();
    tokio::time::sleep(HELD_TTL * 2).await;
    let c = cluster.clone();
    let calls_after = tokio::task::spawn_blocking(move || script_calls(&c))
        .await
        .unwrap();
    let idle_calls = (calls_after - calls_before) as f64 / idle.elapsed().as_secs_f64();
    let live = sessions
        .iter()
        .filter(|s| s.state() == fencelock::SessionState::Live)
        .count();
    let release_rate = release_all(taken.held, |_, g: fencelock::Guard| async move {
        g.release().await.expect("release")
    })
    .await;
    for s in sessions {
        let _ = s.close().await;
    }
    Held {
        rate: taken.rate,
        release_rate,
        client_bytes: taken.client_bytes,
        server_bytes: taken.server_bytes,
        live: Some(live),
        idle_calls,
    }
}

async fn held_rslock(cluster: &Arc<RedisCluster>, n: usize) -> Held {
    let managers: Vec<rslock::LockManager> = (0..HOLDERS)
        .map(|_| rslock_with(&cluster.url(), Duration::from_millis(1)))
        .collect();
    let managers = &managers;
    let taken = take_all(cluster, n, |h, i| async move {
        managers[h]
            .lock(
                format!("rslock-held/{h}/{i}").as_bytes(),
                Duration::from_secs(600),
            )
            .await
            .expect("rslock")
    })
    .await;
    let release_rate = release_all(taken.held, |h, l: rslock::Lock| async move {
        managers[h].unlock(&l).await
    })
    .await;
    Held {
        rate: taken.rate,
        release_rate,
        client_bytes: taken.client_bytes,
        server_bytes: taken.server_bytes,
        live: None,
        idle_calls: 0.0,
    }
}

/// Prints the Redis Cluster rows; skips them if `redis-server` is not installed.
pub async fn redis_cluster_rows(args: &Args) {
    if harness::missing().is_some() {
        crate::emit!("\n(Redis not installed: skipped the cluster)");
        return;
    }
    let cluster = Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("start the cluster"),
    );
    crate::emit!("\n## Redis Cluster (three primaries, a replica each, on loopback)\n");
    crate::emit!(
        "Uncontended acquire + release, {} rounds (interleaved in blocks of 50):\n",
        args.rounds
    );
    super::latency_header("bare SET NX PX");
    let backend = cluster.backend().await;
    let rslock = Arc::new(rslock_with(&cluster.url(), Duration::from_millis(1)));
    let mut ops = [
        our_op(backend.clone(), "cluster-ours").await,
        bare_op(backend.connection(), "bench:bare", Duration::from_millis(1)),
        super::redis::rslock_op_with(rslock.clone(), "bench:rslock"),
    ];
    let samples = time_interleaved(args.rounds, &mut ops).await;
    super::latency_rows(
        &[
            "fencelock Mutex lock + release",
            "bare SET NX PX + delete script (cluster client)",
            "rslock lock + unlock (cluster client)",
        ],
        &samples,
        1,
    );
    super::summary(
        "Redis Cluster",
        "uncontended p50 ms",
        super::ms(samples[0].pct(0.5)),
    );

    crate::emit!(
        "\nContended acquisitions per second on one lock ({} s each in {} alternating pairs of slices; the bare loop after them):\n",
        args.seconds,
        super::PAIRS,
    );
    crate::emit!("| sessions | fencelock Mutex | rslock, retry 1 ms | bare SET NX PX, retry 1 ms | ours vs rslock: median of the pairs (least–greatest) |");
    crate::emit!("|---:|---:|---:|---:|---:|");
    for &n in &args.sessions {
        let mut backends = Vec::new();
        for _ in 0..n {
            backends.push(cluster.backend().await);
        }
        super::redis::contended_row(n, args.seconds, backends, &cluster.url()).await;
    }

    let n = args.cluster_held;
    crate::emit!(
        "\n{n} locks held across the shards: {HOLDERS} sessions (one per backend, as one per process), each taking {} with {IN_FLIGHT} in flight, held for two TTLs ({:?}), then released; rslock likewise ({HOLDERS} managers on the cluster client):\n",
        n / HOLDERS,
        HELD_TTL * 2
    );
    crate::emit!("| implementation | locks | acquisitions/s | releases/s | client bytes per held lock | server bytes per held lock | sessions live after 2 TTL | script calls/s while held |");
    crate::emit!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let ours = held_ours(&cluster, n).await;
    let theirs = held_rslock(&cluster, n).await;
    for (name, h) in [("fencelock Mutex", &ours), ("rslock", &theirs)] {
        crate::emit!(
            "| {name} | {} | {:.0} | {:.0} | {} | {:.0} | {} | {} |",
            n / HOLDERS * HOLDERS,
            h.rate,
            h.release_rate,
            h.client_bytes.map_or("n/a".into(), |b| format!("{b:.0}")),
            h.server_bytes,
            h.live.map_or("—".into(), |l| format!("{l} of {HOLDERS}")),
            if h.live.is_some() {
                format!("{:.0}", h.idle_calls)
            } else {
                "—".into()
            }
        );
    }
    crate::emit!(
        "\nAcquisition rate ours vs rslock: {:.2}x; releases {:.2}x. The script calls while held are the heartbeats: one script per group a session has a key in, every TTL/3.",
        ours.rate / theirs.rate,
        ours.release_rate / theirs.release_rate
    );
    super::summary(
        "Redis Cluster",
        &format!("{n} held acq/s"),
        format!("{:.0}", ours.rate),
    );
}
