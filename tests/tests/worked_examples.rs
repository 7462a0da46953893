//! The worked examples of `examples/` against real servers: PostgreSQL (started here, as an
//! unprivileged user), SQLite, etcd and ZooKeeper.
//!
//! - `fenced_sql`: a holder process paused (SIGSTOP) past its TTL; a successor takes the lock and
//!   writes; the resumed holder's write is refused by the database itself.
//! - `cron`: four instances, one killed on the way: at most one run per trigger.
//! - `orders`: three workers each receiving every order: each processed once.
//! - `leader_state`: a leader paused past its TTL; its guarded write into etcd or ZooKeeper is
//!   refused after the new leader published.

use std::collections::HashMap;
use std::time::Duration;

use fencelock::conformance::unique_namespace;
use fencelock::Session;
use fencelock_examples::sql::Db;
use fencelock_integration::example::Program;
use fencelock_integration::servers::postgres::{self, PgServer};
use fencelock_integration::servers::{etcd, redis, redis_cluster, zookeeper, Cluster};
use fencelock_integration::target::{Kind, Target};

const WITHIN: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(2);

/// A running server (kept running while its guard lives), its target and the examples' flag
/// for it.
type Found = Option<(Box<dyn std::any::Any + Send + Sync>, Target, &'static str)>;

/// The shared server of one backend.
fn backend(kind: Kind) -> Found {
    match kind {
        Kind::Etcd => {
            let c = etcd::shared()?;
            let t = Target::new(kind, c.endpoint(0));
            Some((Box::new(c), t, "--etcd"))
        }
        Kind::ZooKeeper => {
            let c = zookeeper::shared()?;
            let t = Target::new(kind, c.connect_string());
            Some((Box::new(c), t, "--zookeeper"))
        }
        Kind::Redis => {
            let s = redis::shared()?;
            let t = Target::new(kind, s.addr());
            Some((Box::new(s), t, "--redis"))
        }
    }
}

async fn start_pg() -> Option<PgServer> {
    if !postgres::available() {
        return None;
    }
    Some(tokio::task::spawn_blocking(PgServer::start).await.unwrap())
}

/// The fenced-write timeline with a real pause, on `db` (`--postgres …` or `--sqlite …`).
async fn fenced_sql(kind: Kind, db_flag: &str, db_arg: &str, db: Db) {
    let Some((_server, t, flag)) = backend(kind) else {
        return;
    };
    let ns = unique_namespace("fenced_sql");
    let account = 7;
    db.setup(account).await.unwrap();
    let ttl = format!("{}ms", TTL.as_millis());
    let mut a = Program::start(
        "fenced_sql",
        "holder A",
        &[
            flag,
            &t.endpoint,
            db_flag,
            db_arg,
            "--account",
            "7",
            "--name",
            "A",
            "--namespace",
            &ns,
            "--ttl",
            &ttl,
        ],
    );
    let held = tokio::task::block_in_place(|| a.wait_for_line("HELD", WITHIN)).1;
    a.say("write");
    tokio::task::block_in_place(|| a.wait_for("WROTE", WITHIN));
    let a_token: u64 = held.rsplit(' ').next().unwrap().parse().unwrap();

    a.child.pause();
    let b = t.session(&ns, Duration::from_secs(10)).await;
    let gb = tokio::time::timeout(TTL * 3 + WITHIN, b.mutex("accounts/7").unwrap().lock())
        .await
        .expect("B is granted once A's session expired")
        .unwrap();
    assert!(
        gb.token().get() > a_token,
        "B {} after A {a_token} ({held})",
        gb.token()
    );
    assert!(db.fenced_add(account, 1, "B", gb.token()).await.unwrap());
    a.child.resume();
    a.say("write");
    let (_, refused) = tokio::task::block_in_place(|| a.wait_for_line("REFUSED", WITHIN));
    assert!(refused.contains("by B"), "{refused}");
    let row = db.account(account).await.unwrap();
    assert_eq!(
        (row.last_writer.as_str(), row.fence),
        ("B", gb.token().get())
    );
    gb.release().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_sql_postgres_etcd() {
    let Some(pg) = start_pg().await else { return };
    let conn = pg.connection_string();
    let db = Db::postgres(&conn).await.unwrap();
    fenced_sql(Kind::Etcd, "--postgres", &conn, db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_sql_postgres_zookeeper() {
    let Some(pg) = start_pg().await else { return };
    let conn = pg.connection_string();
    let db = Db::postgres(&conn).await.unwrap();
    fenced_sql(Kind::ZooKeeper, "--postgres", &conn, db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_sql_sqlite_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("accounts.db").display().to_string();
    let db = Db::sqlite(&path).unwrap();
    fenced_sql(Kind::Etcd, "--sqlite", &path, db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_sql_sqlite_zookeeper() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("accounts.db").display().to_string();
    let db = Db::sqlite(&path).unwrap();
    fenced_sql(Kind::ZooKeeper, "--sqlite", &path, db).await;
}

/// Four cron instances, one SIGKILLed after the second trigger: every trigger ran at most once,
/// and most of them ran.
async fn cron(kind: Kind) {
    let Some((_server, t, flag)) = backend(kind) else {
        return;
    };
    let ns = unique_namespace("cron");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let out_arg = out.display().to_string();
    const TRIGGERS: usize = 6;
    let mut instances: Vec<Program> = (0..4)
        .map(|i| {
            Program::start(
                "cron",
                &format!("cron-{i}"),
                &[
                    flag,
                    &t.endpoint,
                    "--job",
                    "report",
                    "--every",
                    "1s",
                    "--window",
                    "300ms",
                    "--triggers",
                    "6",
                    "--name",
                    &format!("host-{i}"),
                    "--output",
                    &out_arg,
                    "--namespace",
                    &ns,
                    "--ttl",
                    "2s",
                ],
            )
        })
        .collect();
    // After two triggers, kill one instance (whatever it is doing).
    tokio::task::block_in_place(|| instances[0].wait_for("trigger", WITHIN));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    instances[0].child.kill();
    for p in &mut instances[1..] {
        let start = std::time::Instant::now();
        while p.child.try_wait().is_none() {
            assert!(start.elapsed() < WITHIN, "an instance did not finish");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let runs = std::fs::read_to_string(&out).unwrap_or_default();
    let mut per_trigger: HashMap<&str, Vec<&str>> = HashMap::new();
    for line in runs.lines() {
        let mut f = line.split(' ');
        per_trigger.entry(f.next().unwrap()).or_default().push(line);
    }
    for (trigger, lines) in &per_trigger {
        assert_eq!(
            lines.len(),
            1,
            "trigger {trigger} ran more than once: {lines:?}"
        );
    }
    assert!(
        per_trigger.len() >= TRIGGERS - 2,
        "too few triggers ran: {runs}"
    );
    println!(
        "{kind:?}: {} triggers ran once each:\n{runs}",
        per_trigger.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_etcd() {
    cron(Kind::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_zookeeper() {
    cron(Kind::ZooKeeper).await;
}

/// Three workers, each delivered all 30 orders: each order processed once, the stock down by
/// exactly 30.
async fn orders(kind: Kind) {
    let Some((_server, t, flag)) = backend(kind) else {
        return;
    };
    let Some(pg) = start_pg().await else { return };
    let conn = pg.connection_string();
    let db = Db::postgres(&conn).await.unwrap();
    db.setup(0).await.unwrap();
    let (count0, stock0) = db.orders().await.unwrap();
    let ns = unique_namespace("orders");
    let workers: Vec<Program> = (0..3)
        .map(|i| {
            Program::start(
                "orders",
                &format!("worker-{i}"),
                &[
                    flag,
                    &t.endpoint,
                    "--postgres",
                    &conn,
                    "--worker",
                    &format!("w{i}"),
                    "--orders",
                    "1-30",
                    "--namespace",
                    &ns,
                ],
            )
        })
        .collect();
    let mut processed = 0;
    for w in &workers {
        let (_, done) = tokio::task::block_in_place(|| w.wait_for_line("DONE", WITHIN * 2));
        let p: u64 = done
            .split_whitespace()
            .find_map(|f| f.strip_prefix("processed="))
            .unwrap()
            .parse()
            .unwrap();
        processed += p;
    }
    let (count, stock) = db.orders().await.unwrap();
    assert_eq!(processed, 30, "processed once in all");
    assert_eq!((count - count0, stock0 - stock), (30, 30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_etcd() {
    orders(Kind::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_zookeeper() {
    orders(Kind::ZooKeeper).await;
}

/// A leader paused past its TTL: the other instance leads and publishes; resumed, the old
/// leader's guarded write is refused by the store, whose state stays the new leader's.
async fn leader_state(found: Found) {
    let Some((_server, t, flag)) = found else {
        return;
    };
    let ns = unique_namespace("leader_state");
    let ttl = format!("{}ms", TTL.as_millis());
    let args = |name: &'static str| {
        vec![
            flag.to_string(),
            t.endpoint.clone(),
            "--name".into(),
            name.into(),
            "--every".into(),
            "200ms".into(),
            "--namespace".into(),
            ns.clone(),
            "--ttl".into(),
            ttl.clone(),
        ]
    };
    let a_args = args("node-a");
    let a_refs: Vec<&str> = a_args.iter().map(String::as_str).collect();
    let mut a = Program::start("leader_state", "node-a", &a_refs);
    tokio::task::block_in_place(|| a.wait_for("PUBLISHED node-a", WITHIN));
    let b_args = args("node-b");
    let b_refs: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let b = Program::start("leader_state", "node-b", &b_refs);
    tokio::task::block_in_place(|| b.wait_for("campaigning", WITHIN));
    a.child.pause();
    tokio::task::block_in_place(|| b.wait_for("PUBLISHED node-b", TTL * 3 + WITHIN));
    a.child.resume();
    // Resumed, node-a either writes before it notices that its deadline passed while it was
    // stopped (and the store refuses the stale write), or notices first and steps down without
    // writing: both keep the store safe, and which comes first is a race (CI run 22).
    let (_, line) =
        tokio::task::block_in_place(|| a.wait_for_any(&["REFUSED", "leadership lost"], WITHIN));
    assert!(line.contains("node-a"), "{line}");
    // node-b leads.
    let s: Session = t.session(&ns, Duration::from_secs(10)).await;
    let leader = s
        .election("publisher")
        .unwrap()
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leader.value, b"node-b");
    s.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_state_etcd() {
    leader_state(backend(Kind::Etcd)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_state_zookeeper() {
    leader_state(backend(Kind::ZooKeeper)).await;
}

/// The metrics example prints a Prometheus scrape with fencelock's metrics.
#[test]
fn metrics_example_prints_a_scrape() {
    let p = Program::start("metrics", "metrics", &[]);
    let (_, line) = p.wait_for_line(
        r#"fencelock_acquisitions_total{primitive="mutex",outcome="granted"}"#,
        WITHIN,
    );
    assert!(line.ends_with(" 80"), "4 sessions × 20 rounds: {line}");
    p.wait_for("fencelock_wait_seconds", WITHIN);
}

// The same examples on Redis: the programs change nothing but the backend flag.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_sql_sqlite_redis() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("accounts.db").display().to_string();
    let db = Db::sqlite(&path).unwrap();
    fenced_sql(Kind::Redis, "--sqlite", &path, db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_redis() {
    cron(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_redis() {
    orders(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_state_redis() {
    leader_state(backend(Kind::Redis)).await;
}

/// On a Redis Cluster the state's key takes the election's hash tag (`colocated_key`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_state_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(redis_cluster::shared)
        .await
        .unwrap();
    leader_state(cluster.map(|c| {
        let t = Target::new(Kind::Redis, c.url());
        (
            Box::new(c) as Box<dyn std::any::Any + Send + Sync>,
            t,
            "--redis",
        )
    }))
    .await;
}
