//! The adversity suite on Redis: a primary and an asynchronously replicated replica behind one
//! address, every scenario with the history checker, a summary line per scenario (run with
//! `--nocapture` to see the table).
//!
//! What it shows is what the design documents predict. The scenarios that keep the primary's
//! data (a paused or cut-off holder, an expired waiter, a killed replica) must find no
//! violation, and so must a restart of both servers (the replica first: nothing fails over, and
//! both keep their data in an AOF written with `appendfsync always`). The scenarios that fail
//! over to the replica (killed primary, mixed) lose the primary's last writes: their double
//! grants and refused writes are reported, and only the workload's progress is required of them.

use fencelock_integration::adversity::history::Summary;
use fencelock_integration::adversity::primitive::Primitive;
use fencelock_integration::adversity::{plan, run, RunConfig, Scenario};
use fencelock_integration::servers::available;
use fencelock_integration::servers::redis::RedisPair;
use fencelock_integration::servers::redis_cluster::RedisCluster;
use fencelock_integration::servers::redis_sentinel::{Failover, SentinelGroup};
use fencelock_integration::target::Kind;
use std::time::Duration;

/// How far the replica lags when the primary dies.
const LAG: Duration = Duration::from_millis(300);

/// Whether `scenario` fails over to the replica (and may lose acknowledged writes).
fn fails_over(scenario: Scenario) -> bool {
    matches!(scenario, Scenario::KillLeader | Scenario::Mixed)
}

/// The violations by kind: `token … granted twice: 3, …`.
fn kinds(violations: &[String]) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for v in violations {
        let kind = if v.contains("granted twice") {
            "same token granted twice"
        } else if v.contains("accepted token") {
            "resource accepted a smaller token"
        } else if v.contains("overlap") || v.contains("held at once") {
            "overlapping tenures (double grant)"
        } else if v.contains("entries left") {
            "entries left"
        } else {
            v.as_str()
        };
        *counts.entry(kind).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A suite's rows as they run: the scenarios `FENCELOCK_SCENARIO` selects (every one by
/// default), each row's line, and what fails the test.
struct Suite {
    cfg: RunConfig,
    only: Option<String>,
    lines: Vec<String>,
    failed: Vec<String>,
}

impl Suite {
    /// `None` where Redis is not installed (outside CI).
    fn new() -> Option<Suite> {
        let only = std::env::var("FENCELOCK_SCENARIO").ok();
        // A mistyped selection would run nothing and pass.
        if let Some(o) = &only {
            assert!(
                Scenario::named(o).is_some(),
                "FENCELOCK_SCENARIO names no scenario: {o:?}"
            );
        }
        available(Kind::Redis).then(|| Suite {
            cfg: RunConfig::ci(env!("CARGO_BIN_EXE_holder")),
            only,
            lines: Vec::new(),
            failed: Vec::new(),
        })
    }

    /// Whether `scenario` is to run.
    fn wants(&self, scenario: Scenario) -> bool {
        self.only.as_deref().is_none_or(|o| o == scenario.name())
    }

    /// Records a row (see [`verdict`]).
    fn record(&mut self, s: &Summary, may_lose: bool) {
        self.failed.extend(verdict(s, may_lose));
        self.lines.push(s.line());
    }

    /// Prints the table under `title`; fails if a row did.
    fn finish(self, title: &str) {
        println!("\n{title}:\n{}", Summary::header());
        for l in &self.lines {
            println!("{l}");
        }
        assert!(self.failed.is_empty(), "violations: {:#?}", self.failed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_redis_pair() {
    let Some(mut suite) = Suite::new() else {
        return;
    };
    for (primitive, scenario) in plan() {
        if !suite.wants(scenario) {
            continue;
        }
        // A fresh pair per scenario: a failover leaves the roles swapped and data lost.
        let pair = RedisPair::start(LAG).await;
        let s = run(scenario, primitive, &pair, &suite.cfg).await;
        suite.record(&s, fails_over(scenario));
    }
    suite.finish(&format!(
        "redis (primary + asynchronous replica, failover by REPLICAOF NO ONE after {LAG:?} of lag)"
    ));
}

/// Prints `s`'s row (and its violations by kind) and returns what fails the test: any
/// violation, or, where the design predicts lost grants (`may_lose`), only a workload that did
/// not go on after its fault.
fn verdict(s: &Summary, may_lose: bool) -> Option<String> {
    println!("{}", s.line());
    if !s.violations.is_empty() {
        println!("  {}: {}", s.scenario, kinds(&s.violations));
    }
    let progress: Vec<&String> = s
        .violations
        .iter()
        .filter(|v| {
            v.contains("grants before") || v.contains("grants after") || v.contains("worker")
        })
        .collect();
    if !may_lose && !s.violations.is_empty() {
        Some(format!("{}: {:?}", s.scenario, s.violations))
    } else if !progress.is_empty() {
        Some(format!("{}: {:?}", s.scenario, progress))
    } else {
        None
    }
}

/// The scenarios behind Sentinel: a primary and two replicas, three sentinels that fail over by
/// themselves, every grant and heartbeat acknowledged by a replica (`wait_for_replicas`).
///
/// Each row: how the primary fails over, how many replicas acknowledge each grant and
/// heartbeat (of two), the workload, the scenario.
fn sentinel_plan() -> Vec<(Failover, usize, Primitive, Scenario)> {
    let mut v = vec![
        (Failover::Kill, 1, Primitive::Mutex, Scenario::KillLeader),
        (Failover::Command, 1, Primitive::Mutex, Scenario::KillLeader),
        (Failover::Command, 2, Primitive::Mutex, Scenario::KillLeader),
        (Failover::Kill, 1, Primitive::Mutex, Scenario::PauseLeader),
        (Failover::Kill, 1, Primitive::Mutex, Scenario::KillFollower),
    ];
    for p in [Primitive::ReadWrite, Primitive::Semaphore(3)] {
        v.push((Failover::Kill, 1, p, Scenario::KillLeader));
    }
    v
}

/// What the row of `scenario` made with `failover` is called in the table.
fn sentinel_row(failover: Failover, acks: usize, scenario: Scenario) -> String {
    let what = match (failover, scenario) {
        (Failover::Kill, Scenario::KillLeader) => "kill primary (Sentinel fails over)",
        (Failover::Command, Scenario::KillLeader) => "SENTINEL FAILOVER",
        (_, Scenario::PauseLeader) => "pause primary 3 × TTL (Sentinel fails over)",
        (_, Scenario::KillFollower) => "kill replica",
        (_, s) => s.name(),
    };
    format!("{what}, {acks} of 2 replicas acknowledge")
}

/// Whether a row may find violations, as the design predicts: `SENTINEL FAILOVER` promotes a
/// replica while the old primary runs on, and until the sentinels reconfigure the other
/// replica (a second or so), that replica acknowledges the old primary's writes, which it
/// drops when it follows the new one: grants acknowledged by fewer than every replica can be
/// lost. A killed or paused primary takes no acknowledged write after the promotion.
fn may_lose_grants(failover: Failover, acks: usize) -> bool {
    failover == Failover::Command && acks < 2
}

/// Behind Sentinel with `wait_for_replicas`, a failover loses no acknowledged grant, except
/// where the design predicts it ([`may_lose_grants`]): those rows must be free of violations,
/// and every row's workload must go on after its fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_redis_sentinel() {
    let Some(mut suite) = Suite::new() else {
        return;
    };
    for (failover, acks, primitive, scenario) in sentinel_plan() {
        if !suite.wants(scenario) {
            continue;
        }
        let group = tokio::task::spawn_blocking(move || SentinelGroup::start(failover, acks))
            .await
            .expect("start the Sentinel group");
        let mut s = run(scenario, primitive, &group, &suite.cfg).await;
        let row = sentinel_row(failover, acks, scenario);
        s.scenario = s.scenario.replacen(scenario.name(), &row, 1);
        suite.record(&s, may_lose_grants(failover, acks));
    }
    suite.finish(
        "redis behind Sentinel (a primary, two replicas, three sentinels; grants and heartbeats \
         acknowledged by replicas)",
    );
}

/// The scenarios on a Redis Cluster (three primaries, a replica each; a node failed over after
/// a second without answering): the workload's lock is on one shard, whose primary the leader
/// faults kill or pause (the cluster promotes its replica); the other faults take a node away,
/// or a holder. (A cut-off client needs every node behind a proxy: not here.)
fn cluster_mode_plan() -> Vec<(Primitive, Scenario)> {
    let mut v: Vec<_> = [
        Scenario::KillLeader,
        Scenario::PauseLeader,
        Scenario::KillFollower,
        Scenario::PauseHolder,
    ]
    .into_iter()
    .map(|s| (Primitive::Mutex, s))
    .collect();
    for p in [Primitive::ReadWrite, Primitive::Semaphore(3)] {
        v.push((p, Scenario::KillLeader));
    }
    v
}

/// On a Redis Cluster, whose replication is asynchronous: a failover of the workload's shard
/// (its primary killed or paused) may lose the last grants; every other row must be free of
/// violations, and every row's workload must go on after its fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_redis_cluster_mode() {
    let Some(mut suite) = Suite::new() else {
        return;
    };
    for (primitive, scenario) in cluster_mode_plan() {
        if !suite.wants(scenario) {
            continue;
        }
        // A fresh cluster per scenario: a failover leaves the roles swapped.
        let cluster = tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("start the cluster");
        let s = run(scenario, primitive, &cluster, &suite.cfg).await;
        let may_lose = matches!(scenario, Scenario::KillLeader | Scenario::PauseLeader);
        suite.record(&s, may_lose);
    }
    suite.finish(
        "redis cluster (three primaries, a replica each, asynchronous replication; the \
         workload's shard fails over when its primary is killed or paused)",
    );
}
