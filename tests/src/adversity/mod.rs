//! The adversity suite: a Jepsen-style workload against a cluster of either backend while
//! faults are injected and healed, its history checked afterwards.
//!
//! A run goes by counts, not only by time: it requires [`RunConfig::min_grants`] grants before
//! the first fault and again after the faults healed (each phase capped at
//! [`RunConfig::phase_cap`]), and the checker fails a scenario that did not reach them.

pub mod history;
pub mod inject;
pub mod primitive;
pub mod workload;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::Session;
use tokio::time::Instant;

use self::history::{check, Requirements, Summary};
use self::inject::Stage;
use self::primitive::Primitive;
use self::workload::{worker, ChildWorker, Recorder, Workload};
use crate::proxy::Proxy;
use crate::servers::Cluster;

/// The scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Kill the cluster leader, restart it later.
    KillLeader,
    /// Kill a follower, restart it later.
    KillFollower,
    /// Kill every member, restart them all.
    RestartCluster,
    /// Black-hole one client's connections past its TTL, then heal.
    CutOffClient,
    /// SIGSTOP a holder process past its TTL, then SIGCONT.
    PauseHolder,
    /// Let a session expire while it waits in the queue.
    ExpireWaiter,
    /// Leader kill, client cut-off and holder pause, one after another.
    Mixed,
}

impl Scenario {
    /// The scenarios run with the read-write lock and the semaphore workloads: those that
    /// take a holder away (the mutex runs them all).
    pub const FAMILY: [Scenario; 3] = [
        Scenario::CutOffClient,
        Scenario::PauseHolder,
        Scenario::Mixed,
    ];

    /// Every scenario.
    pub const ALL: [Scenario; 7] = [
        Scenario::KillLeader,
        Scenario::KillFollower,
        Scenario::RestartCluster,
        Scenario::CutOffClient,
        Scenario::PauseHolder,
        Scenario::ExpireWaiter,
        Scenario::Mixed,
    ];

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::KillLeader => "kill leader",
            Scenario::KillFollower => "kill follower",
            Scenario::RestartCluster => "restart cluster",
            Scenario::CutOffClient => "cut off client",
            Scenario::PauseHolder => "pause holder",
            Scenario::ExpireWaiter => "expire waiter",
            Scenario::Mixed => "mixed",
        }
    }

    /// The faults it injects, in order.
    fn steps(self) -> &'static [Scenario] {
        match self {
            Scenario::Mixed => &[
                Scenario::KillLeader,
                Scenario::CutOffClient,
                Scenario::PauseHolder,
            ],
            Scenario::KillLeader => &[Scenario::KillLeader],
            Scenario::KillFollower => &[Scenario::KillFollower],
            Scenario::RestartCluster => &[Scenario::RestartCluster],
            Scenario::CutOffClient => &[Scenario::CutOffClient],
            Scenario::PauseHolder => &[Scenario::PauseHolder],
            Scenario::ExpireWaiter => &[Scenario::ExpireWaiter],
        }
    }
}

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// In-process sessions (one more runs behind a proxy, one in a child process).
    pub sessions: usize,
    /// Session TTL.
    pub ttl: Duration,
    /// The least time the workload runs before the faults and after them.
    pub steady: Duration,
    /// Grants required before the first fault, and again after the faults healed.
    pub min_grants: usize,
    /// The most time a phase waits for its grants.
    pub phase_cap: Duration,
    /// The `holder` binary and its leading arguments (for the child worker).
    pub holder: (String, Vec<String>),
}

impl RunConfig {
    /// The CI defaults: 6 in-process sessions + one behind a proxy + one child process, TTL
    /// 2 s, 50 grants before and after the faults (each phase capped at 90 s).
    /// `FENCELOCK_SOAK_SECS` lengthens the steady phases for soak runs.
    pub fn ci(holder_bin: &str) -> RunConfig {
        let steady = std::env::var("FENCELOCK_SOAK_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_millis(500));
        RunConfig {
            sessions: 6,
            ttl: Duration::from_secs(2),
            steady,
            min_grants: 50,
            phase_cap: Duration::from_secs(90).max(steady * 2),
            holder: (holder_bin.to_string(), Vec::new()),
        }
    }
}

/// Waits until `rec` has `min` grants made after `since` and `steady` has passed, at most
/// `cap`.
async fn phase(rec: &Recorder, since: Instant, cfg: &RunConfig) {
    loop {
        let done = rec.grants_since(since) >= cfg.min_grants && since.elapsed() >= cfg.steady;
        if done || since.elapsed() >= cfg.phase_cap {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `scenario` with a `primitive` workload against `cluster` and checks the history.
pub async fn run(
    scenario: Scenario,
    primitive: Primitive,
    cluster: &dyn Cluster,
    cfg: &RunConfig,
) -> Summary {
    let target = cluster.target();
    let w = Workload {
        lock: "jepsen".into(),
        primitive,
        namespace: fencelock::conformance::unique_namespace("adversity"),
        ttl: cfg.ttl,
        acquire_timeout: cfg.ttl * 3,
        hold: Duration::from_millis(20),
    };
    let rec = Arc::new(Recorder::default());
    let stop = Arc::new(AtomicBool::new(false));
    let sessions = Arc::new(Mutex::new(Vec::<Session>::new()));
    // A proxy in front of every member, for the worker that gets cut off.
    let mut proxies = Vec::new();
    for addr in cluster.endpoints() {
        proxies.push(Proxy::start(&addr).await);
    }
    let proxied = proxies
        .iter()
        .map(Proxy::addr)
        .collect::<Vec<_>>()
        .join(",");
    let mut tasks = Vec::new();
    for i in 0..=cfg.sessions {
        let addr = if i == cfg.sessions {
            proxied.clone()
        } else {
            target.endpoint.clone()
        };
        tasks.push(tokio::spawn(worker(
            format!("w{i}"),
            target.clone(),
            addr,
            w.clone(),
            rec.clone(),
            stop.clone(),
            sessions.clone(),
        )));
    }
    let prefix: Vec<&str> = cfg.holder.1.iter().map(String::as_str).collect();
    let mut child = ChildWorker::start(&cfg.holder.0, &prefix, &target, &w, rec.clone());
    let started = Instant::now();
    phase(&rec, started, cfg).await;

    let fault_began = Instant::now();
    let mut expired_waiter = None;
    {
        let mut stage = Stage {
            cluster,
            proxies: &proxies,
            child: &mut child,
            target: &target,
            workload: &w,
            sessions: &sessions,
        };
        for step in scenario.steps() {
            rec.faults.fetch_add(1, Ordering::SeqCst);
            match step {
                Scenario::KillLeader => inject::kill_leader(&mut stage).await,
                Scenario::KillFollower => inject::kill_follower(&mut stage).await,
                Scenario::RestartCluster => inject::restart_cluster(&mut stage).await,
                Scenario::CutOffClient => inject::cut_off_client(&mut stage).await,
                Scenario::PauseHolder => inject::pause_holder(&mut stage).await,
                Scenario::ExpireWaiter => {
                    expired_waiter = Some(inject::expire_waiter(&mut stage).await)
                }
                Scenario::Mixed => unreachable!("mixed is made of the others"),
            }
        }
    }
    let healed = Instant::now();
    phase(&rec, healed, cfg).await;
    let stopped = Instant::now();
    stop.store(true, Ordering::SeqCst);
    let bound = w.acquire_timeout + Duration::from_secs(5);
    let mut extra = Vec::new();
    for t in tasks {
        match tokio::time::timeout(bound, t).await {
            Err(_) => extra.push("a worker did not stop".to_string()),
            Ok(Err(join)) => extra.push(format!("worker died: {join}")),
            Ok(Ok(())) => {}
        }
    }
    if let Some(status) = child.exited() {
        extra.push(format!("child worker exited early: {status}"));
    }
    child.stop();
    if let Some(waiting) = expired_waiter {
        match tokio::time::timeout(Duration::from_secs(5), waiting).await {
            Ok(Ok(Err(fencelock::Error::SessionLost(_)))) => {}
            Ok(Ok(Ok(_))) => {} // granted before it expired: allowed
            other => extra.push(format!(
                "expired waiter did not fail with SessionLost: {other:?}"
            )),
        }
    }
    // Close everything, then list the namespace on the cluster. Entries of sessions that were
    // lost (not closed) go when the cluster expires them.
    let all: Vec<Session> = sessions.lock().unwrap().drain(..).collect();
    for s in all {
        let _ = tokio::time::timeout(Duration::from_secs(5), s.close()).await;
    }
    let probe = target.session(&w.namespace, Duration::from_secs(10)).await;
    let start = Instant::now();
    let leftover = loop {
        let list = probe.list_entries().await.unwrap_or_default();
        if list.is_empty() || start.elapsed() > cfg.ttl * 3 + Duration::from_secs(5) {
            break list.len();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = probe.close().await;
    let record = rec.record(fault_began, healed, stopped, leftover);
    let req = Requirements {
        bound,
        min_grants: cfg.min_grants,
        limit: primitive.limit(),
    };
    let name = match primitive {
        Primitive::Mutex => scenario.name().to_string(),
        p => format!("{}: {}", p.arg(), scenario.name()),
    };
    let mut summary = check(&name, &record, req);
    summary.violations.extend(extra);
    if std::env::var("FENCELOCK_DEBUG_HISTORY").is_ok() && !summary.violations.is_empty() {
        eprintln!("{}", cluster.dump(&w.namespace).await);
    }
    summary
}

/// The workloads of a full run: every scenario with the mutex, [`Scenario::FAMILY`] with a
/// read-write lock and a 3-permit semaphore.
pub fn plan() -> Vec<(Primitive, Scenario)> {
    let mut v: Vec<_> = Scenario::ALL
        .into_iter()
        .map(|s| (Primitive::Mutex, s))
        .collect();
    for p in [Primitive::ReadWrite, Primitive::Semaphore(3)] {
        v.extend(Scenario::FAMILY.into_iter().map(|s| (p, s)));
    }
    v
}

/// Runs the [`plan`] (or only the scenarios named by `FENCELOCK_SCENARIO`, and only the
/// primitive named by `FENCELOCK_PRIMITIVE`) against `cluster`, prints the summary table under
/// `label`, and panics if any scenario found a violation.
pub async fn run_all(label: &str, cluster: &dyn Cluster, cfg: &RunConfig) {
    let only = std::env::var("FENCELOCK_SCENARIO").ok();
    let only_primitive = std::env::var("FENCELOCK_PRIMITIVE").ok();
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for (primitive, scenario) in plan() {
        if only.as_deref().is_some_and(|o| o != scenario.name())
            || only_primitive
                .as_deref()
                .is_some_and(|o| o != primitive.arg())
        {
            continue;
        }
        let s = run(scenario, primitive, cluster, cfg).await;
        println!("{}", s.line());
        lines.push(s.line());
        if !s.violations.is_empty() {
            failed.push(format!("{}: {:?}", s.scenario, s.violations));
        }
    }
    println!("\n{label}:\n{}", Summary::header());
    for l in &lines {
        println!("{l}");
    }
    assert!(failed.is_empty(), "violations: {failed:#?}");
}
