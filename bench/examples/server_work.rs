//! The server's own work per contended acquisition, from its counters: what a handoff costs
//! ZooKeeper or etcd with our `Mutex`, next to the peer's recipe (ZooKeeper:
//! `zookeeper-client`'s `Client::lock`) or the raw two-client ping-pong of the benchmark's
//! handoff limit (etcd). Where the contended rows miss their targets, this says whether the
//! server is asked for more than the peer asks, or for as much, more slowly.
//!
//! `server_work <zookeeper|etcd> [seconds]` starts its own server (loopback, temporary data
//! dir), then for 1, 4 and 16 sessions (one connection each) prints acquisitions per second and,
//! per acquisition:
//! - ZooKeeper: requests received and replies and notifications sent (`mntr`'s
//!   `zk_packets_received`, `zk_packets_sent`), and the CPU time of the server and of this
//!   client process (`/proc/PID/stat`, in 10 ms ticks: read the larger figures),
//!   and how often the threads of each went to sleep (voluntary context switches);
//! - etcd: gRPC messages received by method (`grpc_server_msg_received_total`), the store's
//!   ranges (each compare of a txn is one), puts, deletes and txns, watch events, WAL fsyncs
//!   (`/metrics`).
//!
//! `server_work redis`: the same for Redis, ours against `rslock` (retrying after 1 ms): the
//! commands the server ran per acquisition (`INFO commandstats`, each command a script calls
//! counted), its CPU (`INFO cpu`, in µs) and the client's, and the threads' sleeps of both.
//!
//! `server_work zookeeper-held`: one session takes 1,000 locks new to the server (64 in
//! flight), then releases them all; the same ZooKeeper figures per lock for each phase, ours
//! and the recipe's, twice.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fencelock::Session;
use fencelock_bench::redis as bench_redis;
use fencelock_bench::zookeeper::{our_op, our_session, recipe_op, zk_client};
use fencelock_bench::{pingpong, run_slice};
use fencelock_integration::load::{self, Load};
use fencelock_integration::notifications::http_get;
use fencelock_integration::servers::etcd::{self as etcd_harness, EtcdCluster};
use fencelock_integration::servers::redis::{Durability, RedisServer};
use fencelock_integration::servers::zookeeper::ZkEnsemble;
use fencelock_integration::servers::Cluster;
use zookeeper_client as zk;

const SESSIONS: [usize; 3] = [1, 4, 16];
const TTL: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds = match args.get(1).map(|s| s.parse::<f64>()) {
        None => 3.0,
        Some(Ok(s)) if s > 0.0 && s <= 600.0 => s,
        Some(_) => usage(),
    };
    match args.first().map(String::as_str) {
        Some("zookeeper") => zookeeper(seconds).await,
        Some("zookeeper-held") => zookeeper_held().await,
        Some("etcd") => etcd(seconds).await,
        Some("redis") => redis(seconds).await,
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("usage: server_work <zookeeper|etcd|redis|zookeeper-held> [seconds, 3 by default]");
    std::process::exit(2);
}

/// A counter's rise per acquisition, for each counter that rose.
fn per_acquisition(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    acquisitions: f64,
) -> Vec<(String, f64)> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                (v - before.get(k).unwrap_or(&0.0)) / acquisitions,
            )
        })
        .filter(|(_, d)| *d >= 0.005)
        .collect()
}

/// User + system CPU time of process `pid`, in clock ticks (10 ms).
fn cpu_ticks(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    tick(11) + tick(12)
}

/// Voluntary context switches of process `pid`, summed over its threads (`/proc/PID/task/*/status`):
/// how often its threads went to sleep, so about how many wake-ups its work took.
fn sleeps(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .sum()
}

/// `n` contenders, each made by `make` (one connection each).
async fn contenders<F, Fut>(n: usize, mut make: F) -> Vec<fencelock_bench::Op>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = fencelock_bench::Op>,
{
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        ops.push(make().await);
    }
    ops
}

/// `mntr`'s numeric values.
fn mntr(server: &ZkEnsemble) -> BTreeMap<String, f64> {
    let text = server.four_letter(0, "mntr").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(char::is_whitespace)?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// What a ZooKeeper row reads before and after its phase.
struct ZkSample {
    mntr: BTreeMap<String, f64>,
    server_ticks: f64,
    client_ticks: f64,
    server_sleeps: f64,
    client_sleeps: f64,
    at: Instant,
}

impl ZkSample {
    fn now(server: &ZkEnsemble, pid: u32) -> ZkSample {
        ZkSample {
            mntr: mntr(server),
            server_ticks: cpu_ticks(pid),
            client_ticks: cpu_ticks(std::process::id()),
            server_sleeps: sleeps(pid),
            client_sleeps: sleeps(std::process::id()),
            at: Instant::now(),
        }
    }
}

/// Prints a ZooKeeper row: `name`, `what` (sessions or phase), then the rate of `count`
/// operations between `a` and `b`, and per operation the requests, the replies and
/// notifications, the CPU of the server and of this process, and their threads' sleeps.
fn zk_row(name: &str, what: &str, a: &ZkSample, b: &ZkSample, count: u64) {
    let count = count.max(1) as f64;
    let d = per_acquisition(&a.mntr, &b.mntr, count);
    let get = |k: &str| d.iter().find(|(n, _)| n == k).map_or(0.0, |(_, v)| *v);
    println!(
        "| {name} | {what} | {:.0} | {:.2} | {:.2} | {:.0} | {:.0} | {:.1} | {:.1} |",
        count / (b.at - a.at).as_secs_f64(),
        get("zk_packets_received"),
        get("zk_packets_sent"),
        (b.server_ticks - a.server_ticks) * 10_000.0 / count,
        (b.client_ticks - a.client_ticks) * 10_000.0 / count,
        (b.server_sleeps - a.server_sleeps) / count,
        (b.client_sleeps - a.client_sleeps) / count,
    );
}

async fn zookeeper(seconds: f64) {
    let server = tokio::task::spawn_blocking(|| ZkEnsemble::start(1))
        .await
        .expect("start ZooKeeper");
    let connect = server.connect_string();
    let pid = server.pid(0).expect("server pid");
    println!("ZooKeeper, {seconds} s per row; per acquisition:\n");
    println!("| implementation | sessions | acquisitions/s | requests | replies + notifications | server CPU µs | client CPU µs | server thread sleeps | client thread sleeps |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in SESSIONS {
        for ours in [true, false] {
            let ops = contenders(n, || async {
                if ours {
                    our_op(&connect, "contended").await
                } else {
                    recipe_op(zk_client(&connect).await, "/bench/recipe")
                }
            })
            .await;
            // A first slice makes the queue's parent and warms the server up.
            let (_, _, ops) = run_slice(ops, 0.5).await;
            let before = ZkSample::now(&server, pid);
            let (counts, _, _) = run_slice(ops, seconds).await;
            let after = ZkSample::now(&server, pid);
            let name = if ours {
                "fencelock Mutex"
            } else {
                "zookeeper-client Client::lock"
            };
            zk_row(name, &n.to_string(), &before, &after, counts.iter().sum());
        }
    }
}

/// One session takes 1,000 distinct locks new to the server (64 in flight), then releases
/// them all: the requests and CPU of each phase, per lock, ours and the recipe's.
async fn zookeeper_held() {
    use futures::{stream, StreamExt};
    const N: usize = 1000;
    let server = tokio::task::spawn_blocking(|| ZkEnsemble::start(1))
        .await
        .expect("start ZooKeeper");
    let connect = server.connect_string();
    let pid = server.pid(0).expect("server pid");
    println!("ZooKeeper, {N} fresh locks in one session (64 in flight); per lock:\n");
    println!("| implementation | phase | per second | requests | replies + notifications | server CPU µs | client CPU µs | server thread sleeps | client thread sleeps |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let sample = || ZkSample::now(&server, pid);
    let n = N as u64;
    for rep in 0..2 {
        let session = our_session(&connect, TTL).await;
        let names: Vec<String> = (0..N).map(|i| format!("held/r{rep}/{i}")).collect();
        let a = sample();
        let guards: Vec<fencelock::Guard> = stream::iter(&names)
            .map(|name| {
                let s = session.clone();
                async move { s.mutex(name).expect("mutex").lock().await.expect("lock") }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        let b = sample();
        stream::iter(guards)
            .map(|g| async move { g.release().await.expect("release") })
            .buffer_unordered(64)
            .collect::<Vec<()>>()
            .await;
        let c = sample();
        zk_row("fencelock Mutex", "acquire", &a, &b, n);
        zk_row("fencelock Mutex", "release", &b, &c, n);
        session.close().await.expect("close");

        let client = zk_client(&connect).await;
        let dirs: Vec<String> = (0..N)
            .map(|i| format!("/bench/peer-held/r{rep}/{i}"))
            .collect();
        let a = sample();
        let held: Vec<zk::OwnedLockClient> = stream::iter(&dirs)
            .map(|dir| {
                let c = client.clone();
                async move {
                    let prefix = zk::LockPrefix::new_curator(dir, "lock-").expect("prefix");
                    let options = zk::LockOptions::new(zk::Acls::anyone_all())
                        .with_ancestor_options(
                            zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()),
                        )
                        .expect("options");
                    c.lock(prefix, b"", options)
                        .await
                        .expect("lock")
                        .into_owned()
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        let b = sample();
        stream::iter(held)
            .map(|l| async move {
                l.delete(l.lock_path(), None).await.expect("delete");
                std::mem::forget(l);
            })
            .buffer_unordered(64)
            .collect::<Vec<()>>()
            .await;
        let c = sample();
        zk_row("zookeeper-client Client::lock", "acquire", &a, &b, n);
        zk_row("zookeeper-client Client::lock", "release", &b, &c, n);
    }
}

/// The counters of an etcd member's `/metrics` this program reports, summed by gRPC method.
async fn etcd_metrics(endpoint: &str) -> BTreeMap<String, f64> {
    const NAMES: [&str; 7] = [
        "grpc_server_msg_received_total",
        "etcd_debugging_mvcc_range_total",
        "etcd_debugging_mvcc_put_total",
        "etcd_debugging_mvcc_delete_total",
        "etcd_debugging_mvcc_txn_total",
        "etcd_debugging_mvcc_events_total",
        "etcd_disk_wal_fsync_duration_seconds_count",
    ];
    let addr = endpoint.trim_start_matches("http://").to_string();
    let body = tokio::task::spawn_blocking(move || http_get(&addr, "/metrics"))
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    let mut counters = BTreeMap::new();
    for line in body.lines() {
        for name in NAMES {
            let Some((labels, value)) = line.strip_prefix(name).and_then(|r| r.rsplit_once(' '))
            else {
                continue;
            };
            if !(labels.is_empty() || labels.starts_with('{')) {
                continue;
            }
            let method = labels
                .split("grpc_method=\"")
                .nth(1)
                .and_then(|m| m.split('"').next())
                .map_or(String::new(), |m| format!(" {m}"));
            *counters.entry(format!("{name}{method}")).or_insert(0.0) +=
                value.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    counters
}

async fn etcd(seconds: f64) {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .expect("start etcd");
    let ep = cluster.endpoint(0);
    println!("etcd, {seconds} s per row; per acquisition (handoff for the ping-pong):\n");
    println!("| implementation | sessions | acquisitions/s | counter | per acquisition |");
    println!("|---|---:|---:|---|---:|");
    for n in SESSIONS {
        // The sessions kept for the row: an op holds its mutex, not its session.
        let mut sessions: Vec<Session> = Vec::new();
        for _ in 0..n {
            let b = etcd_harness::connect(std::slice::from_ref(&ep)).await;
            let s = Session::builder(b)
                .namespace("bench")
                .ttl(TTL)
                .start()
                .await
                .expect("session");
            sessions.push(s);
        }
        let ops = sessions
            .iter()
            .map(|s| load::our_op(s.clone(), Load::Mutex, "contended"))
            .collect();
        let (_, _, ops) = run_slice(ops, 0.5).await;
        let before = etcd_metrics(&ep).await;
        let (counts, elapsed, _) = run_slice(ops, seconds).await;
        let after = etcd_metrics(&ep).await;
        let acquisitions = counts.iter().sum::<u64>().max(1) as f64;
        let rate = acquisitions / elapsed;
        etcd_rows("fencelock Mutex", n, rate, &before, &after, acquisitions);
    }
    let before = etcd_metrics(&ep).await;
    let rate = pingpong::etcd(&ep, seconds).await;
    let after = etcd_metrics(&ep).await;
    let handoffs = (rate * seconds).max(1.0);
    etcd_rows(
        "raw ping-pong (the handoff limit)",
        2,
        rate,
        &before,
        &after,
        handoffs,
    );
}

/// Prints the etcd rows of `name`: its sessions and rate once, then each counter that rose
/// between `before` and `after`, per one of `count` acquisitions.
fn etcd_rows(
    name: &str,
    sessions: usize,
    rate: f64,
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    count: f64,
) {
    for (i, (k, v)) in per_acquisition(before, after, count).iter().enumerate() {
        if i == 0 {
            println!("| {name} | {sessions} | {rate:.0} | {k} | {v:.2} |");
        } else {
            println!("|  |  |  | {k} | {v:.2} |");
        }
    }
}

/// What a Redis row reads before and after its phase: `INFO`'s fields of its server, as
/// numbers (`cmdstat_*` lines give their `calls`), and this process's CPU and sleeps.
struct RedisSample {
    info: BTreeMap<String, f64>,
    client_ticks: f64,
    client_sleeps: f64,
    at: Instant,
}

impl RedisSample {
    fn now(server: &RedisServer) -> RedisSample {
        let text = server.cli(&["INFO", "all"]).unwrap_or_default();
        let mut info = BTreeMap::new();
        for line in text.lines() {
            let Some((k, v)) = line.trim().split_once(':') else {
                continue;
            };
            let value = match k.strip_prefix("cmdstat_") {
                // `calls=N,usec=…`
                Some(_) => v.split(',').find_map(|f| f.strip_prefix("calls=")),
                None => Some(v),
            };
            if let Some(n) = value.and_then(|v| v.parse::<f64>().ok()) {
                info.insert(k.to_string(), n);
            }
        }
        RedisSample {
            info,
            client_ticks: cpu_ticks(std::process::id()),
            client_sleeps: sleeps(std::process::id()),
            at: Instant::now(),
        }
    }
}

async fn redis(seconds: f64) {
    let server = tokio::task::spawn_blocking(|| RedisServer::start(Durability::None))
        .await
        .expect("start redis");
    let url = server.url();
    let sample = || RedisSample::now(&server);
    let pid = sample().info.get("process_id").copied().unwrap_or(0.0) as u32;
    println!("Redis, {seconds} s per row; per acquisition:\n");
    println!("| implementation | sessions | acquisitions/s | commands (each a script calls counted) | scripts run (FCALL, EVALSHA) | server CPU µs | client CPU µs | server thread sleeps | client thread sleeps |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in SESSIONS {
        for ours in [true, false] {
            let ops = contenders(n, || async {
                if ours {
                    bench_redis::our_op(server.backend().await, "contended").await
                } else {
                    bench_redis::rslock_op(&url, "bench:rslock-contended")
                }
            })
            .await;
            let (_, _, ops) = run_slice(ops, 0.5).await;
            let (a, server_a) = (sample(), sleeps(pid));
            let (counts, _, _) = run_slice(ops, seconds).await;
            let (b, server_b) = (sample(), sleeps(pid));
            let count = counts.iter().sum::<u64>().max(1) as f64;
            let rise = |k: &dyn Fn(&str) -> bool| {
                b.info
                    .iter()
                    .filter(|(name, _)| k(name))
                    .map(|(name, v)| v - a.info.get(name).unwrap_or(&0.0))
                    .sum::<f64>()
                    / count
            };
            let commands = rise(&|k| k.starts_with("cmdstat_") && k != "cmdstat_info");
            let scripts =
                rise(&|k| ["cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval"].contains(&k));
            let cpu = rise(&|k| k == "used_cpu_sys" || k == "used_cpu_user") * 1e6;
            println!(
                "| {} | {n} | {:.0} | {commands:.2} | {:.2} | {cpu:.0} | {:.0} | {:.1} | {:.1} |",
                if ours {
                    "fencelock Mutex"
                } else {
                    "rslock, retry 1 ms"
                },
                count / (b.at - a.at).as_secs_f64(),
                scripts,
                (b.client_ticks - a.client_ticks) * 10_000.0 / count,
                (server_b - server_a) / count,
                (b.client_sleeps - a.client_sleeps) / count,
            );
        }
    }
}
