//! The ZooKeeper rows of the benchmark (`src/main.rs`), side by side in one run against one
//! local server started here with the harness of [`fencelock_integration::servers::zookeeper`]:
//!
//! 1. uncontended acquire + release latency of our `Mutex`, of a raw ephemeral-sequential
//!    create + delete, and of `zookeeper-client`'s own lock recipe (`Client::lock` with
//!    Curator's naming), measured in interleaved blocks so that the server's JIT warm-up and
//!    drift hit every row alike;
//! 2. contended acquisitions per second with N sessions (one connection each), ours vs the
//!    recipe, and Apache Curator's `InterProcessMutex` (Java, `tests/java/CuratorBench.java`)
//!    with 4 sessions when java, javac and Debian's `libcurator-recipes-java` are installed;
//! 3. leader election: campaign latency and failover (leader's session closed; leader's process
//!    killed, TTL 2 s). The killed rows re-run the current executable as
//!    `<exe> holder zookeeper ...` (the bench's `main` serves that mode).
//!
//! Every release is confirmed (the delete's reply awaited), the recipe's too: dropping
//! `zookeeper-client`'s `LockClient` would delete in the background, unconfirmed.

use std::sync::Arc;
use std::time::Duration;

use fencelock::Session;
use fencelock_zookeeper::ZooKeeperBackend;
use zookeeper_client as zk;

use super::{
    election_header, election_rows, ms, throughput, throughput_pair, time_interleaved, Args, Op,
};
use fencelock_integration::curator;
use fencelock_integration::servers::zookeeper::{self as harness, ZkEnsemble, MIN_SESSION_TIMEOUT};
use fencelock_integration::target::{Kind, Target};

/// The session TTL of the latency and throughput rows.
const TTL: Duration = Duration::from_secs(10);

async fn backend(connect: &str) -> ZooKeeperBackend {
    ZooKeeperBackend::builder(connect)
        .min_ttl(MIN_SESSION_TIMEOUT)
        .connect()
        .await
        .expect("connect to ZooKeeper")
}

/// A session of its own (one connection) on `connect`, in namespace `bench`, with `ttl`.
pub async fn our_session(connect: &str, ttl: Duration) -> Session {
    Session::builder(backend(connect).await)
        .namespace("bench")
        .ttl(ttl)
        .start()
        .await
        .expect("session")
}

/// Our `Mutex` lock + release on `name`, in a session of its own (one connection).
pub async fn our_op(connect: &str, name: &str) -> Op {
    let s = our_session(connect, TTL).await;
    let m = Arc::new(s.mutex(name).expect("mutex"));
    Box::new(move || {
        let (m, _s) = (m.clone(), s.clone());
        Box::pin(async move {
            let g = m.lock().await.expect("lock");
            g.release().await.expect("release");
        })
    })
}

/// `zookeeper-client`'s lock recipe (`Client::lock`, Curator's `_c_{uuid}-lock-` naming,
/// CONTAINER parents like ours) on `dir`, with a confirmed delete as release.
pub fn recipe_op(client: zk::Client, dir: &'static str) -> Op {
    Box::new(move || {
        let c = client.clone();
        Box::pin(async move {
            let prefix = zk::LockPrefix::new_curator(dir, "lock-").expect("prefix");
            let options = zk::LockOptions::new(zk::Acls::anyone_all())
                .with_ancestor_options(zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()))
                .expect("lock options");
            let lock = c.lock(prefix, b"", options).await.expect("recipe lock");
            c.delete(lock.lock_path(), None)
                .await
                .expect("recipe delete");
            // Released above, confirmed: skip the drop's background delete.
            std::mem::forget(lock);
        })
    })
}

/// A `zookeeper-client` connection to `connect`, with the rows' session timeout.
pub async fn zk_client(connect: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(TTL)
        .connect(connect)
        .await
        .expect("zookeeper-client connect")
}

/// Prints the ZooKeeper rows (markdown tables): uncontended latency of `rounds` acquire +
/// release, contended throughput for each count of `sessions` during `seconds` each (plus
/// Apache Curator with 4 sessions when Java and Curator are installed), and the election rows
/// with `failovers` repetitions per failover column. Starts (and stops) its own server;
/// prints a skip line if ZooKeeper is not installed.
pub async fn zookeeper_rows(args: &Args) {
    let (rounds, seconds, failovers) = (args.rounds, args.seconds, args.failovers);
    if harness::missing().is_some() {
        crate::emit!("\n(ZooKeeper not installed: skipped)");
        return;
    }
    // The held-locks rows keep every lock's parent node until the server reaps it: with
    // 100,000 locks per repetition, more than the tests' heap.
    let most_held = args.held.iter().copied().max().unwrap_or(0);
    let options = harness::ZkOptions {
        heap_mib: (most_held > 20_000).then_some(2048),
        ..Default::default()
    };
    let server = tokio::task::spawn_blocking(move || ZkEnsemble::start_with(1, options))
        .await
        .expect("start ZooKeeper");
    let connect = server.connect_string();
    crate::emit!("\n## ZooKeeper (single server, {connect})\n");
    if args.contended_only {
        contended_rows(seconds, &args.sessions, &connect).await;
        return;
    }
    if !args.family_only && !args.scale_only {
        uncontended_rows(rounds, &connect).await;
        let ours4 = contended_rows(seconds, &args.sessions, &connect).await;
        curator_row(seconds, &connect, ours4).await;
    }
    if !args.scale_only {
        let c = connect.clone();
        super::family::zookeeper_family_rows(seconds, &connect, server.port(0), move || {
            let c = c.clone();
            Box::pin(async move { our_session(&c, TTL).await })
        })
        .await;
    }
    if !args.family_only && !args.scale_only {
        election_header("ZooKeeper");
        let t = Target::new(Kind::ZooKeeper, connect.clone());
        election_rows(rounds, failovers, &t).await;
    }
    if !args.family_only && !args.no_scale {
        super::scale::zookeeper_scale(&args.held, &args.waiters, &connect, server.port(0)).await;
    }
    drop(server);
}

async fn uncontended_rows(rounds: usize, connect: &str) {
    crate::emit!("Uncontended acquire + release, {rounds} rounds (interleaved in blocks of 50):\n");
    super::latency_header("recipe");
    let client = zk_client(connect).await;
    client
        .mkdir(
            "/bench/raw",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("mkdir /bench/raw");
    let raw: Op = {
        let client = client.clone();
        Box::new(move || {
            let c = client.clone();
            Box::pin(async move {
                let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
                let (_, seq) = c
                    .create("/bench/raw/lock-", b"", &options)
                    .await
                    .expect("raw create");
                c.delete(&format!("/bench/raw/lock-{seq}"), None)
                    .await
                    .expect("raw delete");
            })
        })
    };
    let ours = our_op(connect, "ours").await;
    let recipe = recipe_op(client.clone(), "/bench/recipe");
    let mut ops = [ours, raw, recipe];
    let samples = time_interleaved(rounds, &mut ops).await;
    super::summary("ZooKeeper", "uncontended p50 ms", ms(samples[0].pct(0.5)));
    super::latency_rows(
        &[
            "fencelock Mutex lock + release",
            "raw create EPHEMERAL_SEQUENTIAL + delete",
            "zookeeper-client Client::lock + delete",
        ],
        &samples,
        2,
    );
}

/// Returns our figure for 4 sessions, if measured.
async fn contended_rows(seconds: f64, sessions: &[usize], connect: &str) -> Option<f64> {
    crate::emit!(
        "\nContended acquisitions per second ({seconds} s each, in {} alternating pairs of slices, one connection per session):\n",
        super::PAIRS
    );
    crate::emit!(
        "(in parentheses: the least-served session's acquisitions as a share of the most-served one's, 1.00 all alike)\n"
    );
    crate::emit!("| sessions | fencelock Mutex | zookeeper-client Client::lock | ratio: median of the pairs (least–greatest) |");
    crate::emit!("|---:|---:|---:|---:|");
    let mut ours4 = None;
    let mut rows = Vec::new();
    for &n in sessions {
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for _ in 0..n {
            ours.push(our_op(connect, "contended").await);
            theirs.push(recipe_op(
                zk_client(connect).await,
                "/bench/recipe-contended",
            ));
        }
        let pair = throughput_pair(ours, theirs, seconds).await;
        let (ours, theirs) = super::contended_row(n, &pair);
        rows.push((n, pair));
        super::summary(
            "ZooKeeper",
            &format!("{n} sessions acq/s"),
            format!("{ours:.0}"),
        );
        super::report::define(
            "zookeeper-throughput",
            "ZooKeeper: contended acquisitions per second",
            "contending sessions",
            "acquisitions/s",
            true,
        );
        super::report::point("zookeeper-throughput", "fencelock Mutex", n as f64, ours);
        super::report::point(
            "zookeeper-throughput",
            "zookeeper-client Client::lock",
            n as f64,
            theirs,
        );
        if n == 4 {
            ours4 = Some(ours);
        }
    }
    let mut limits = Vec::new();
    for _ in 0..super::PAIRS {
        limits.push(super::pingpong::zookeeper(connect, seconds / super::PAIRS as f64).await);
    }
    super::limit_rows("zookeeper-client Client::lock", &limits, &rows);
    ours4
}

/// Apache Curator's `InterProcessMutex` (Java) with 4 sessions, next to ours.
async fn curator_row(seconds: f64, connect: &str, ours4: Option<f64>) {
    if !curator::installed() {
        crate::emit!(
            "\n(Apache Curator row skipped: missing {})",
            curator::missing().join(", ")
        );
        return;
    }
    let classes = match tokio::task::spawn_blocking(curator::JavaClasses::compile).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return crate::emit!("\n(Apache Curator row skipped: {e})"),
        Err(e) => return crate::emit!("\n(Apache Curator row skipped: {e})"),
    };
    let theirs = match curator::bench_rate(&classes, connect, "/bench/curator", 4, seconds).await {
        Ok(r) => r,
        Err(e) => return crate::emit!("\n(Apache Curator row failed: {e})"),
    };
    let ours = match ours4 {
        Some(o) => o,
        None => {
            let mut ops = Vec::new();
            for _ in 0..4 {
                ops.push(our_op(connect, "contended").await);
            }
            throughput(ops, seconds).await
        }
    };
    crate::emit!("\nApache Curator `InterProcessMutex` (Java 17, one JVM, one connection per session, after a JIT warm-up):\n");
    crate::emit!("| sessions | fencelock Mutex | Curator InterProcessMutex | ratio |");
    crate::emit!("|---:|---:|---:|---:|");
    crate::emit!("| 4 | {ours:.0} | {theirs:.0} | {:.2}x |", ours / theirs);
    super::report::point(
        "zookeeper-throughput",
        "Curator InterProcessMutex",
        4.0,
        theirs,
    );
}
