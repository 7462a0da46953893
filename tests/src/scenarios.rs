//! The fault scenarios of the adversity suite, run against a 3-member cluster of either
//! backend: a workload of sessions (some in child processes, one behind a proxy) contends for
//! one lock while a fault is injected and healed; the history is then checked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::Session;
use tokio::time::Instant;

use crate::faults::Target;
use crate::history::{check, worker, ChildWorker, History, Summary, Workload};
use crate::proxy::{Mode, Proxy};

/// What a scenario may do to the cluster.
#[async_trait::async_trait]
pub trait Cluster: Send {
    /// The target with every member's endpoint (comma-separated).
    fn target(&self) -> Target;
    /// Member `i`'s client endpoint.
    fn member(&self, i: usize) -> String;
    /// The index of the current leader.
    async fn leader(&self) -> usize;
    /// SIGKILL member `i`.
    fn kill(&mut self, i: usize);
    /// Restart member `i` on its data dir.
    fn restart(&mut self, i: usize);
}

#[async_trait::async_trait]
impl Cluster for crate::cluster::EtcdCluster {
    fn target(&self) -> Target {
        Target {
            kind: crate::faults::Kind::Etcd,
            endpoint: self.endpoints().join(","),
        }
    }
    fn member(&self, i: usize) -> String {
        self.endpoint(i)
    }
    async fn leader(&self) -> usize {
        crate::cluster::EtcdCluster::leader(self).await
    }
    fn kill(&mut self, i: usize) {
        crate::cluster::EtcdCluster::kill(self, i)
    }
    fn restart(&mut self, i: usize) {
        crate::cluster::EtcdCluster::restart(self, i)
    }
}

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
}

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// In-process sessions (one more runs behind a proxy, one in a child process).
    pub sessions: usize,
    /// Session TTL.
    pub ttl: Duration,
    /// How long the workload runs before and after the faults.
    pub steady: Duration,
    /// The `holder` binary and its leading arguments (for the child worker).
    pub holder: (String, Vec<String>),
}

impl RunConfig {
    /// The CI defaults: 6 in-process sessions + one behind a proxy + one child process, TTL 2 s.
    /// `FENCELOCK_SOAK_SECS` lengthens the steady phases for soak runs.
    pub fn ci(holder_bin: &str) -> RunConfig {
        let steady = std::env::var("FENCELOCK_SOAK_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_millis(1500));
        RunConfig {
            sessions: 6,
            ttl: Duration::from_secs(2),
            steady,
            holder: (holder_bin.to_string(), Vec::new()),
        }
    }
}

/// Runs `scenario` against `cluster` and checks the history.
pub async fn run(scenario: Scenario, cluster: &mut dyn Cluster, cfg: &RunConfig) -> Summary {
    let target = cluster.target();
    let w = Workload {
        lock: "jepsen".into(),
        namespace: fencelock::conformance::unique_namespace("adversity"),
        ttl: cfg.ttl,
        acquire_timeout: cfg.ttl * 3,
        hold: Duration::from_millis(20),
    };
    let history = Arc::new(History::default());
    let stop = Arc::new(AtomicBool::new(false));
    let sessions = Arc::new(Mutex::new(Vec::<Session>::new()));
    // Proxies in front of every member for the cut-off client.
    let mut proxies = Vec::new();
    for i in 0..3 {
        proxies.push(Proxy::start(&cluster.member(i)).await);
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
            history.clone(),
            stop.clone(),
            sessions.clone(),
        )));
    }
    let prefix: Vec<&str> = cfg.holder.1.iter().map(String::as_str).collect();
    let mut child = ChildWorker::start(&cfg.holder.0, &prefix, &target, &w, history.clone());
    tokio::time::sleep(cfg.steady).await;

    let steps: &[Scenario] = match scenario {
        Scenario::Mixed => &[
            Scenario::KillLeader,
            Scenario::CutOffClient,
            Scenario::PauseHolder,
        ],
        _ => std::slice::from_ref(&scenario),
    };
    let mut expired_waiter = None;
    for step in steps {
        history.faults.fetch_add(1, Ordering::SeqCst);
        match step {
            Scenario::KillLeader | Scenario::KillFollower => {
                let leader = cluster.leader().await;
                let victim = if *step == Scenario::KillLeader {
                    leader
                } else {
                    (leader + 1) % 3
                };
                cluster.kill(victim);
                tokio::time::sleep(cfg.ttl + Duration::from_secs(1)).await;
                cluster.restart(victim);
            }
            Scenario::RestartCluster => {
                for i in 0..3 {
                    cluster.kill(i);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                for i in 0..3 {
                    cluster.restart(i);
                }
            }
            Scenario::CutOffClient => {
                for p in &proxies {
                    p.set(Mode::BlackHole);
                }
                tokio::time::sleep(cfg.ttl + Duration::from_secs(1)).await;
                for p in &proxies {
                    p.set(Mode::Pass);
                }
            }
            Scenario::PauseHolder => {
                // Pause the child while it holds the lock, if it gets it in time.
                let start = Instant::now();
                while child.holding.lock().unwrap().is_none()
                    && start.elapsed() < Duration::from_secs(10)
                {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                child.signal("STOP");
                tokio::time::sleep(cfg.ttl + Duration::from_millis(1500)).await;
                child.signal("CONT");
            }
            Scenario::ExpireWaiter => {
                let s = target
                    .session_at(&target.endpoint, &w.namespace, cfg.ttl)
                    .await;
                sessions.lock().unwrap().push(s.clone());
                let m = s.mutex(&w.lock).unwrap();
                let waiting =
                    tokio::spawn(async move { m.lock_timeout(Duration::from_secs(30)).await });
                tokio::time::sleep(Duration::from_millis(200)).await;
                s.halt_heartbeats();
                expired_waiter = Some(waiting);
                tokio::time::sleep(cfg.ttl + Duration::from_secs(1)).await;
            }
            Scenario::Mixed => unreachable!(),
        }
    }
    let healed = Instant::now();
    tokio::time::sleep(cfg.steady).await;
    stop.store(true, Ordering::SeqCst);
    let bound = cfg.steady + w.acquire_timeout + Duration::from_secs(5);
    let mut stuck = 0;
    let mut extra = Vec::new();
    for t in tasks {
        match tokio::time::timeout(bound, t).await {
            Err(_) => stuck += 1,
            Ok(Err(join)) => extra.push(format!("worker died: {join}")),
            Ok(Ok(())) => {}
        }
    }
    let finished = Instant::now();
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
    // Close everything, then list the namespace on the server.
    let all: Vec<Session> = sessions.lock().unwrap().drain(..).collect();
    for s in all {
        let _ = tokio::time::timeout(Duration::from_secs(5), s.close()).await;
    }
    let probe = target
        .session_at(&target.endpoint, &w.namespace, Duration::from_secs(10))
        .await;
    // Entries of sessions that were lost (not closed) go when the cluster expires them.
    let start = Instant::now();
    let leftover = loop {
        let list = probe.list_entries().await.unwrap_or_default();
        if list.is_empty() || start.elapsed() > cfg.ttl * 3 + Duration::from_secs(5) {
            break list.len();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = probe.close().await;
    let mut summary = check(
        scenario.name(),
        &history,
        healed,
        finished,
        bound * 2,
        leftover,
    );
    if std::env::var("FENCELOCK_DEBUG_HISTORY").is_ok() && !summary.violations.is_empty() {
        if let crate::faults::Kind::Etcd = target.kind {
            dump_etcd_history(&target, &w.namespace).await;
        }
    }
    if stuck > 0 {
        summary
            .violations
            .push(format!("{stuck} workers stuck past the bound"));
    }
    summary.violations.extend(extra);
    summary
}

/// Prints every event under `namespace` from revision 1 (debugging aid).
async fn dump_etcd_history(target: &Target, namespace: &str) {
    let eps: Vec<&str> = target.endpoint.split(',').collect();
    let mut c = etcd_client::Client::connect(eps, None).await.unwrap();
    let mut ws = c
        .watch(
            format!("{namespace}/"),
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(1),
            ),
        )
        .await
        .unwrap();
    let _ = ws.message().await; // created
    while let Ok(Ok(Some(resp))) = tokio::time::timeout(Duration::from_secs(2), ws.message()).await
    {
        for ev in resp.events() {
            let kv = ev.kv().unwrap();
            eprintln!(
                "{:?} key={} create={} mod={} lease={:x}",
                ev.event_type(),
                String::from_utf8_lossy(kv.key()),
                kv.create_revision(),
                kv.mod_revision(),
                kv.lease()
            );
        }
    }
}

/// Runs every scenario (or only the one named by `FENCELOCK_SCENARIO`) against `cluster`,
/// prints the summary table under `label`, and panics if any scenario found a violation.
pub async fn run_all(label: &str, cluster: &mut dyn Cluster, cfg: &RunConfig) {
    let only = std::env::var("FENCELOCK_SCENARIO").ok();
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for scenario in Scenario::ALL {
        if only.as_deref().is_some_and(|o| o != scenario.name()) {
            continue;
        }
        let s = run(scenario, cluster, cfg).await;
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
