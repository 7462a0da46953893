//! A Jepsen-style workload and history checker: N sessions repeatedly acquire one lock, write
//! to a fenced resource and release, while the test injects faults; every event is recorded and
//! checked afterwards.
//!
//! Checks: (1) the resource never accepted a token lower than one it had accepted; (2) grants
//! are totally ordered by token and no two in-process tenures overlap (a tenure ends when the
//! holder calls `release()` or its `lost()` fires); (3) every acquisition ended within a bound
//! after the faults healed; (4) no entry is left on the server once every session is closed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::{Error, Fence, FencingToken, Session};
use tokio::time::Instant;

use crate::faults::Target;

/// The protected resource: a fenced register that logs what it accepted and refused.
#[derive(Debug, Default)]
pub struct Resource {
    fence: Fence,
    accepted: Mutex<Vec<u64>>,
    refused: AtomicU64,
}

impl Resource {
    /// A fenced write with `token`; returns whether it was accepted.
    pub fn write(&self, token: u64) -> bool {
        // Admission and logging under one lock, so the log order is the admission order.
        let mut log = self.accepted.lock().unwrap();
        match self.fence.admit(FencingToken::new(token)) {
            Ok(()) => {
                log.push(token);
                true
            }
            Err(_) => {
                self.refused.fetch_add(1, Ordering::SeqCst);
                false
            }
        }
    }
}

/// One acquisition attempt, as recorded.
#[derive(Debug, Clone)]
pub struct Op {
    /// Which worker (and its session id).
    pub worker: String,
    /// When `lock_timeout` was called.
    pub invoked: Instant,
    /// When it returned.
    pub completed: Instant,
    /// The token, if granted.
    pub token: Option<u64>,
    /// When the tenure ended (release called, or `lost()` fired), if granted.
    pub ended: Option<Instant>,
    /// Whether the tenure ended by a loss rather than a release.
    pub lost: bool,
    /// The error, if not granted (`Timeout` included).
    pub error: Option<String>,
    /// Whether this op ran in a child process (its tenure is only known coarsely).
    pub remote: bool,
}

/// The shared record of a run.
#[derive(Debug, Default)]
pub struct History {
    /// Every op.
    pub ops: Mutex<Vec<Op>>,
    /// The resource.
    pub resource: Resource,
    /// Faults injected.
    pub faults: AtomicU64,
}

/// Workload settings.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The lock's name.
    pub lock: String,
    /// The namespace.
    pub namespace: String,
    /// Session TTL.
    pub ttl: Duration,
    /// Bound of each acquisition.
    pub acquire_timeout: Duration,
    /// How long a holder keeps the lock (it writes at the start and at the end).
    pub hold: Duration,
}

/// Runs one in-process worker until `stop`: acquire, fenced write, hold, write, release. A
/// lost session is replaced by a new one. `addr` is where this worker connects (the cluster,
/// or a proxy in front of it).
pub async fn worker(
    name: String,
    target: Target,
    addr: String,
    w: Workload,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
    sessions: Arc<Mutex<Vec<Session>>>,
) {
    let mut session: Option<Session> = None;
    while !stop.load(Ordering::SeqCst) {
        let s = match &session {
            Some(s) if !matches!(s.state(), fencelock::SessionState::Lost(_)) => s.clone(),
            _ => {
                let opened = tokio::time::timeout(w.acquire_timeout, async {
                    Session::builder(target.try_backend_at(&addr).await?)
                        .namespace(w.namespace.as_str())
                        .ttl(w.ttl)
                        .start()
                        .await
                })
                .await;
                match opened {
                    Ok(Ok(s)) => {
                        sessions.lock().unwrap().push(s.clone());
                        session = Some(s.clone());
                        s
                    }
                    _ => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
        let invoked = Instant::now();
        let r = s
            .mutex(&w.lock)
            .unwrap()
            .lock_timeout(w.acquire_timeout)
            .await;
        let completed = Instant::now();
        let mut op = Op {
            worker: format!("{name}/{}", s.id()),
            invoked,
            completed,
            token: None,
            ended: None,
            lost: false,
            error: None,
            remote: false,
        };
        match r {
            Ok(g) => {
                op.token = Some(g.token().get());
                let lost = g.lost();
                tokio::pin!(lost);
                let mut was_lost = false;
                if g.is_held() {
                    history.resource.write(g.token().get());
                    tokio::select! {
                        _ = &mut lost => was_lost = true,
                        _ = tokio::time::sleep(w.hold) => {}
                    }
                    if !was_lost && g.is_held() {
                        history.resource.write(g.token().get());
                    }
                } else {
                    was_lost = true;
                }
                if was_lost || !g.is_held() {
                    op.lost = true;
                    op.ended = Some(Instant::now());
                    drop(g);
                } else {
                    op.ended = Some(Instant::now());
                    let _ = g.release().await;
                }
            }
            Err(e) => {
                op.error = Some(match e {
                    Error::Timeout { .. } => "timeout".into(),
                    other => other.to_string(),
                });
                if matches!(op.error.as_deref(), Some(m) if m != "timeout") {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        history.ops.lock().unwrap().push(op);
    }
}

/// A worker in a child process (`holder worker ...`), so that the test can SIGSTOP it. Its
/// writes reach the resource when the test reads them from the child's stdout: a paused
/// child's late write arrives late, as it would over a network.
pub struct ChildWorker {
    /// `None` once reaped: no signal may reach a recycled PID.
    child: Option<Child>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// Tokens the child announced as granted and not yet ended (to pause it while holding).
    pub holding: Arc<Mutex<Option<u64>>>,
}

impl ChildWorker {
    /// Starts `bin worker <kind> <endpoints> <ns> <lock> <ttl-ms> <hold-ms>`.
    pub fn start(
        bin: &str,
        prefix: &[&str],
        target: &Target,
        w: &Workload,
        history: Arc<History>,
    ) -> ChildWorker {
        let kind = match target.kind {
            crate::faults::Kind::Etcd => "etcd",
            crate::faults::Kind::ZooKeeper => "zookeeper",
        };
        let mut child = Command::new(bin)
            .args(prefix)
            .args(["worker", kind, &target.endpoint, &w.namespace, &w.lock])
            .arg(w.ttl.as_millis().to_string())
            .arg(w.hold.as_millis().to_string())
            .arg(w.acquire_timeout.as_millis().to_string())
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start child worker");
        let out = child.stdout.take().unwrap();
        let holding = Arc::new(Mutex::new(None));
        let h = holding.clone();
        let reader = std::thread::spawn(move || {
            let mut granted: Option<(u64, Instant)> = None;
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let mut it = line.split_whitespace();
                let (Some(tag), Some(tok)) =
                    (it.next(), it.next().and_then(|t| t.parse::<u64>().ok()))
                else {
                    continue;
                };
                match tag {
                    "G" => {
                        granted = Some((tok, Instant::now()));
                        *h.lock().unwrap() = Some(tok);
                    }
                    "W" => {
                        history.resource.write(tok);
                    }
                    "E" => {
                        *h.lock().unwrap() = None;
                        if let Some((t, at)) = granted.take() {
                            history.ops.lock().unwrap().push(Op {
                                worker: "child".into(),
                                invoked: at,
                                completed: at,
                                token: Some(t),
                                ended: Some(Instant::now()),
                                lost: false,
                                error: None,
                                remote: true,
                            });
                        }
                    }
                    _ => {}
                }
            }
        });
        ChildWorker {
            child: Some(child),
            reader: Some(reader),
            holding,
        }
    }

    /// Sends `kill -SIG` to the child (nothing once it is reaped).
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(c.id().to_string())
                .status();
        }
    }

    /// Whether the child exited by itself (it never should: it loops until killed).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Stops the child (CONT, then SIGKILL), reaps it and waits for its output.
    pub fn stop(mut self) {
        self.reap();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }

    fn reap(&mut self) {
        self.signal("CONT");
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        self.reap();
    }
}

/// The body of `holder worker <kind> <endpoints> <ns> <lock> <ttl-ms> <hold-ms> <timeout-ms>`:
/// loops acquire → `G token` → wait `hold` → `W token` → release → `E token` until killed.
pub async fn run_child_worker(args: &[String]) {
    use std::io::Write;
    let [kind, endpoint, ns, lock, ttl, hold, timeout] = args else {
        eprintln!("usage: worker <kind> <endpoints> <ns> <lock> <ttl-ms> <hold-ms> <timeout-ms>");
        std::process::exit(2);
    };
    let ms = |s: &String| Duration::from_millis(s.parse().expect("ms"));
    let target = Target {
        kind: match kind.as_str() {
            "etcd" => crate::faults::Kind::Etcd,
            _ => crate::faults::Kind::ZooKeeper,
        },
        endpoint: endpoint.clone(),
    };
    let mut out = std::io::stdout();
    let mut session: Option<Session> = None;
    loop {
        let s = match &session {
            Some(s) if !matches!(s.state(), fencelock::SessionState::Lost(_)) => s.clone(),
            _ => {
                let opened = async {
                    Session::builder(target.try_backend_at(endpoint).await?)
                        .namespace(ns.as_str())
                        .ttl(ms(ttl))
                        .start()
                        .await
                }
                .await;
                match opened {
                    Ok(s) => {
                        session = Some(s.clone());
                        s
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
        match s.mutex(lock).unwrap().lock_timeout(ms(timeout)).await {
            Ok(g) => {
                let t = g.token().get();
                let _ = writeln!(out, "G {t}");
                let _ = out.flush();
                tokio::time::sleep(ms(hold)).await;
                // Written even if lost meanwhile: a paused process does not know yet. The fence
                // must refuse it.
                let _ = writeln!(out, "W {t}");
                let _ = out.flush();
                let _ = g.release().await;
                let _ = writeln!(out, "E {t}");
                let _ = out.flush();
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The outcome of the checker for one scenario.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// Acquisitions attempted.
    pub ops: usize,
    /// Acquisitions granted.
    pub grants: usize,
    /// Faults injected.
    pub faults: u64,
    /// Stale writes the fence refused.
    pub stale_refused: u64,
    /// Violations found (must be 0), with descriptions.
    pub violations: Vec<String>,
    /// Entries left on the server after every session closed (must be 0).
    pub leftover: usize,
    /// The longest time without any holder while workers were trying.
    pub longest_unavailable: Duration,
}

impl Summary {
    /// One line for the summary table.
    pub fn line(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} s |",
            self.scenario,
            self.ops,
            self.grants,
            self.faults,
            self.stale_refused,
            self.violations.len(),
            self.leftover,
            self.longest_unavailable.as_secs_f64()
        )
    }

    /// The table header.
    pub fn header() -> &'static str {
        "| scenario | ops | grants | faults | stale writes refused | violations | leftover entries | longest unavailability |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    }
}

/// Checks a finished history. `healed` is when the last fault healed, `bound` how long after
/// it every acquisition must have ended, `finished` when the last worker stopped.
pub fn check(
    scenario: &str,
    h: &History,
    healed: Instant,
    finished: Instant,
    bound: Duration,
    leftover: usize,
) -> Summary {
    let ops = h.ops.lock().unwrap().clone();
    let mut v = Vec::new();
    // (1) the resource's accepted tokens never decrease.
    let accepted = h.resource.accepted.lock().unwrap().clone();
    for w in accepted.windows(2) {
        if w[1] < w[0] {
            v.push(format!("resource accepted {} after {}", w[1], w[0]));
        }
    }
    // (2) grants unique and totally ordered; in-process tenures do not overlap.
    let mut grants: Vec<&Op> = ops.iter().filter(|o| o.token.is_some()).collect();
    grants.sort_by_key(|o| o.token);
    for w in grants.windows(2) {
        if w[0].token == w[1].token {
            v.push(format!("token {:?} granted twice", w[0].token));
        }
    }
    let local: Vec<&&Op> = grants.iter().filter(|o| !o.remote).collect();
    for w in local.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a.ended.expect("ended") > b.completed {
            v.push(format!(
                "tenures overlap: {} (token {:?}, lost={}) ended after {} (token {:?}) was granted",
                a.worker, a.token, a.lost, b.worker, b.token
            ));
        }
    }
    // (3) every acquisition ended within the bound after the faults healed.
    if finished > healed + bound {
        v.push(format!(
            "acquisitions still running {:?} after the faults healed",
            finished - healed
        ));
    }
    // Longest unavailability: the largest gap between a tenure's end and the next grant.
    let mut by_time: Vec<&Op> = grants.clone();
    by_time.sort_by_key(|o| o.completed);
    let longest = by_time
        .windows(2)
        .map(|w| {
            w[1].completed
                .saturating_duration_since(w[0].ended.unwrap_or(w[0].completed))
        })
        .max()
        .unwrap_or_default();
    if leftover > 0 {
        v.push(format!("{leftover} entries left on the server"));
    }
    Summary {
        scenario: scenario.to_string(),
        ops: ops.iter().filter(|o| !o.remote).count() + grants.iter().filter(|o| o.remote).count(),
        grants: grants.len(),
        faults: h.faults.load(Ordering::SeqCst),
        stale_refused: h.resource.refused.load(Ordering::SeqCst),
        violations: v,
        leftover,
        longest_unavailable: longest,
    }
}
