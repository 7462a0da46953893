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
//!   client process (`/proc/PID/stat`, in 10 ms ticks: read the larger figures);
//! - etcd: gRPC messages received by method (`grpc_server_msg_received_total`), the store's
//!   ranges (each compare of a txn is one), puts, deletes and txns, watch events, WAL fsyncs
//!   (`/metrics`).
//!
//! `server_work zookeeper-held`: one session takes 1,000 locks new to the server (64 in
//! flight), then releases them all; the same ZooKeeper figures per lock for each phase, ours
//! and the recipe's, twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fencelock::Session;
use fencelock_bench::{pingpong, run_slice, Op};
use fencelock_integration::notifications::http_get;
use fencelock_integration::servers::etcd::{self as etcd_harness, EtcdCluster};
use fencelock_integration::servers::zookeeper::{ZkEnsemble, MIN_SESSION_TIMEOUT};
use fencelock_integration::servers::Cluster;
use fencelock_zookeeper::ZooKeeperBackend;
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
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("usage: server_work <zookeeper|etcd|zookeeper-held> [seconds, 3 by default]");
    std::process::exit(2);
}

/// Our `Mutex` lock + release on `contended`, in a session of `session`'s.
fn mutex_op(session: Session) -> Op {
    let m = Arc::new(session.mutex("contended").expect("mutex"));
    Box::new(move || {
        let (m, _s) = (m.clone(), session.clone());
        Box::pin(async move {
            let g = m.lock().await.expect("lock");
            g.release().await.expect("release");
        })
    })
}

async fn session_on(backend: impl fencelock::IntoBackend) -> Session {
    Session::builder(backend)
        .namespace("bench")
        .ttl(TTL)
        .start()
        .await
        .expect("session")
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

async fn zookeeper(seconds: f64) {
    let server = tokio::task::spawn_blocking(|| ZkEnsemble::start(1))
        .await
        .expect("start ZooKeeper");
    let connect = server.connect_string();
    let (pid, me) = (server.pid(0).expect("server pid"), std::process::id());
    println!("ZooKeeper, {seconds} s per row; per acquisition:\n");
    println!("| implementation | sessions | acquisitions/s | requests | replies + notifications | server CPU µs | client CPU µs |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for n in SESSIONS {
        for ours in [true, false] {
            let mut ops = Vec::new();
            for _ in 0..n {
                ops.push(if ours {
                    let b = ZooKeeperBackend::builder(connect.as_str())
                        .min_ttl(MIN_SESSION_TIMEOUT)
                        .connect()
                        .await
                        .expect("connect");
                    mutex_op(session_on(b).await)
                } else {
                    recipe_op(&connect).await
                });
            }
            // A first slice makes the queue's parent and warms the server up.
            let (_, _, ops) = run_slice(ops, 0.5).await;
            let (before, server0, client0) = (mntr(&server), cpu_ticks(pid), cpu_ticks(me));
            let (counts, elapsed, _) = run_slice(ops, seconds).await;
            let (after, server1, client1) = (mntr(&server), cpu_ticks(pid), cpu_ticks(me));
            let acquisitions = counts.iter().sum::<u64>().max(1) as f64;
            let d = per_acquisition(&before, &after, acquisitions);
            let get = |k: &str| d.iter().find(|(n, _)| n == k).map_or(0.0, |(_, v)| *v);
            let name = if ours {
                "fencelock Mutex"
            } else {
                "zookeeper-client Client::lock"
            };
            println!(
                "| {name} | {n} | {:.0} | {:.2} | {:.2} | {:.0} | {:.0} |",
                acquisitions / elapsed,
                get("zk_packets_received"),
                get("zk_packets_sent"),
                (server1 - server0) * 10_000.0 / acquisitions,
                (client1 - client0) * 10_000.0 / acquisitions,
            );
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
    let (pid, me) = (server.pid(0).expect("server pid"), std::process::id());
    println!("ZooKeeper, {N} fresh locks in one session (64 in flight); per lock:\n");
    println!("| implementation | phase | per second | requests | replies + notifications | server CPU µs | client CPU µs |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let sample = || {
        (
            mntr(&server),
            cpu_ticks(pid),
            cpu_ticks(me),
            std::time::Instant::now(),
        )
    };
    let row = |name: &str,
               phase: &str,
               a: &(BTreeMap<String, f64>, f64, f64, std::time::Instant),
               b: &(BTreeMap<String, f64>, f64, f64, std::time::Instant)| {
        let d = per_acquisition(&a.0, &b.0, N as f64);
        let get = |k: &str| d.iter().find(|(n, _)| n == k).map_or(0.0, |(_, v)| *v);
        println!(
            "| {name} | {phase} | {:.0} | {:.2} | {:.2} | {:.0} | {:.0} |",
            N as f64 / (b.3 - a.3).as_secs_f64(),
            get("zk_packets_received"),
            get("zk_packets_sent"),
            (b.1 - a.1) * 10_000.0 / N as f64,
            (b.2 - a.2) * 10_000.0 / N as f64,
        );
    };
    for rep in 0..2 {
        let b = ZooKeeperBackend::builder(connect.as_str())
            .min_ttl(MIN_SESSION_TIMEOUT)
            .connect()
            .await
            .expect("connect");
        let session = session_on(b).await;
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
        row("fencelock Mutex", "acquire", &a, &b);
        row("fencelock Mutex", "release", &b, &c);
        session.close().await.expect("close");

        let client = zk::Client::connector()
            .with_session_timeout(TTL)
            .connect(&connect)
            .await
            .expect("zookeeper-client connect");
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
        row("zookeeper-client Client::lock", "acquire", &a, &b);
        row("zookeeper-client Client::lock", "release", &b, &c);
    }
}

/// `zookeeper-client`'s lock recipe (Curator's naming, container parents) and a confirmed
/// delete, on a connection of its own: as the benchmark's contended rows run it.
async fn recipe_op(connect: &str) -> Op {
    let client = zk::Client::connector()
        .with_session_timeout(TTL)
        .connect(connect)
        .await
        .expect("zookeeper-client connect");
    Box::new(move || {
        let c = client.clone();
        Box::pin(async move {
            let prefix = zk::LockPrefix::new_curator("/bench/recipe", "lock-").expect("prefix");
            let options = zk::LockOptions::new(zk::Acls::anyone_all())
                .with_ancestor_options(zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()))
                .expect("options");
            let lock = c.lock(prefix, b"", options).await.expect("recipe lock");
            c.delete(lock.lock_path(), None).await.expect("delete");
            // Released above, confirmed: skip the drop's background delete.
            std::mem::forget(lock);
        })
    })
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
        let mut ops = Vec::new();
        for _ in 0..n {
            let b = etcd_harness::connect(std::slice::from_ref(&ep)).await;
            ops.push(mutex_op(session_on(b).await));
        }
        let (_, _, ops) = run_slice(ops, 0.5).await;
        let before = etcd_metrics(&ep).await;
        let (counts, elapsed, _) = run_slice(ops, seconds).await;
        let after = etcd_metrics(&ep).await;
        let acquisitions = counts.iter().sum::<u64>().max(1) as f64;
        for (i, (k, v)) in per_acquisition(&before, &after, acquisitions)
            .iter()
            .enumerate()
        {
            let (name, sessions, rate) = if i == 0 {
                (
                    "fencelock Mutex",
                    n.to_string(),
                    format!("{:.0}", acquisitions / elapsed),
                )
            } else {
                ("", String::new(), String::new())
            };
            println!("| {name} | {sessions} | {rate} | {k} | {v:.2} |");
        }
    }
    let before = etcd_metrics(&ep).await;
    let rate = pingpong::etcd(&ep, seconds).await;
    let after = etcd_metrics(&ep).await;
    for (i, (k, v)) in per_acquisition(&before, &after, (rate * seconds).max(1.0))
        .iter()
        .enumerate()
    {
        let (name, sessions, shown) = if i == 0 {
            (
                "raw ping-pong (the handoff limit)",
                "2",
                format!("{rate:.0}"),
            )
        } else {
            ("", "", String::new())
        };
        println!("| {name} | {sessions} | {shown} | {k} | {v:.2} |");
    }
}
