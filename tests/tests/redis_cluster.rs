//! The adversity suite on Redis: a primary and an asynchronously replicated replica behind one
//! address, every scenario with the history checker, a summary line per scenario (run with
//! `--nocapture` to see the table).
//!
//! What it shows is what the design documents predict. The scenarios that keep the primary's
//! data (a paused or cut-off holder, an expired waiter, a killed replica) must find no
//! violation. The scenarios that fail over to the replica (killed primary, restarted cluster,
//! mixed) lose the primary's last writes: their double grants and refused writes are reported,
//! and only the workload's progress is required of them.

use fencelock_integration::adversity::history::Summary;
use fencelock_integration::adversity::{plan, run, RunConfig, Scenario};
use fencelock_integration::servers::available;
use fencelock_integration::servers::redis::RedisPair;
use fencelock_integration::target::Kind;
use std::time::Duration;

/// How far the replica lags when the primary dies.
const LAG: Duration = Duration::from_millis(300);

/// Whether `scenario` fails over to the replica (and may lose acknowledged writes).
fn fails_over(scenario: Scenario) -> bool {
    matches!(
        scenario,
        Scenario::KillLeader | Scenario::RestartCluster | Scenario::Mixed
    )
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_redis_pair() {
    if !available(Kind::Redis) {
        return;
    }
    let cfg = RunConfig::ci(env!("CARGO_BIN_EXE_holder"));
    let only = std::env::var("FENCELOCK_SCENARIO").ok();
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for (primitive, scenario) in plan() {
        if only.as_deref().is_some_and(|o| o != scenario.name()) {
            continue;
        }
        // A fresh pair per scenario: a failover leaves the roles swapped and data lost.
        let pair = RedisPair::start(LAG).await;
        let s = run(scenario, primitive, &pair, &cfg).await;
        println!("{}", s.line());
        if !s.violations.is_empty() {
            println!("  {}: {}", s.scenario, kinds(&s.violations));
        }
        lines.push(s.line());
        let progress: Vec<&String> = s
            .violations
            .iter()
            .filter(|v| {
                v.contains("grants before") || v.contains("grants after") || v.contains("worker")
            })
            .collect();
        if !fails_over(scenario) && !s.violations.is_empty() {
            failed.push(format!("{}: {:?}", s.scenario, s.violations));
        } else if fails_over(scenario) && !progress.is_empty() {
            failed.push(format!("{}: {:?}", s.scenario, progress));
        }
    }
    println!(
        "\nredis (primary + asynchronous replica, failover by REPLICAOF NO ONE after {LAG:?} of lag):\n{}",
        Summary::header()
    );
    for l in &lines {
        println!("{l}");
    }
    assert!(failed.is_empty(), "violations: {failed:#?}");
}
