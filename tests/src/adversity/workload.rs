//! The adversity workload: sessions that repeatedly acquire one lock (a mutex, a read-write
//! lock or a semaphore), write to (or read) a fenced resource and release, while faults are
//! injected; and the recorder of what they did.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::{Error, Fence, FencingToken, Session, SessionState};
use tokio::time::Instant;

use super::history::{Op, Record};
use super::primitive::{Grant, Primitive};
use crate::process::ManagedChild;
use crate::target::{Kind, Target};

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

    /// A fenced read with `token` (a reader's): refused, as stale, if a writer with a larger
    /// token has written (no writer granted after a reader may write while it still reads).
    pub fn read(&self, token: u64) -> bool {
        let log = self.accepted.lock().unwrap();
        if log.last().is_some_and(|&last| last > token) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The access of a holder of `grant`: a write, or a read for a reader; nothing for a
    /// permit (see [`Primitive::fenced`]).
    fn access(&self, grant: &Grant) {
        match grant {
            Grant::Read(_) => {
                self.read(grant.token());
            }
            Grant::Permit(_) => {}
            _ => {
                self.write(grant.token());
            }
        }
    }
}

/// Records every acquisition of a run as it happens.
#[derive(Debug, Default)]
pub struct Recorder {
    ops: Mutex<Vec<Op>>,
    /// The fenced resource the holders write to.
    pub resource: Resource,
    /// Faults injected so far.
    pub faults: AtomicU64,
}

impl Recorder {
    /// An acquisition by `worker` begins now; returns its id.
    pub fn begin(&self, worker: String, remote: bool) -> usize {
        let mut ops = self.ops.lock().unwrap();
        ops.push(Op {
            worker,
            invoked: Instant::now(),
            completed: None,
            token: None,
            ended: None,
            lost: false,
            error: None,
            remote,
            shared: false,
        });
        ops.len() - 1
    }

    /// Acquisition `id` was granted `token` (`shared`: a reader's or a permit) now.
    pub fn granted(&self, id: usize, token: u64, shared: bool) {
        let mut ops = self.ops.lock().unwrap();
        ops[id].completed = Some(Instant::now());
        ops[id].token = Some(token);
        ops[id].shared = shared;
    }

    /// Acquisition `id` failed now with `error`.
    pub fn failed(&self, id: usize, error: String) {
        let mut ops = self.ops.lock().unwrap();
        ops[id].completed = Some(Instant::now());
        ops[id].error = Some(error);
    }

    /// The tenure of acquisition `id` ended now (`lost` if by a loss).
    pub fn ended(&self, id: usize, lost: bool) {
        let mut ops = self.ops.lock().unwrap();
        ops[id].ended = Some(Instant::now());
        ops[id].lost = lost;
    }

    /// Grants so far that were made after `since`.
    pub fn grants_since(&self, since: Instant) -> usize {
        let ops = self.ops.lock().unwrap();
        ops.iter()
            .filter(|o| o.token.is_some() && o.completed.is_some_and(|c| c > since))
            .count()
    }

    /// What was recorded, for the checker.
    pub fn record(
        &self,
        fault_began: Instant,
        healed: Instant,
        stopped: Instant,
        leftover: usize,
    ) -> Record {
        Record {
            ops: self.ops.lock().unwrap().clone(),
            accepted: self.resource.accepted.lock().unwrap().clone(),
            refused: self.resource.refused.load(Ordering::SeqCst),
            faults: self.faults.load(Ordering::SeqCst),
            fault_began,
            healed,
            stopped,
            leftover,
        }
    }
}

/// Workload settings.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The lock's name.
    pub lock: String,
    /// What the lock is.
    pub primitive: Primitive,
    /// The namespace.
    pub namespace: String,
    /// Session TTL.
    pub ttl: Duration,
    /// Bound of each acquisition.
    pub acquire_timeout: Duration,
    /// How long a holder keeps the lock (it writes at the start and at the end).
    pub hold: Duration,
}

/// The sessions every worker opened, to close them all at the end; each marked `true` if it
/// talks to the cluster directly (not through the proxy, not a session lost on purpose).
pub type Sessions = Arc<Mutex<Vec<(bool, Session)>>>;

/// Where a worker connects.
#[derive(Debug, Clone)]
pub enum Route {
    /// To the cluster's members directly, at this address.
    Direct(String),
    /// Through the proxies in front of them, at this address.
    Proxied(String),
}

/// Runs one in-process worker until `stop`: acquire, fenced write, hold, write, release. A lost
/// session is replaced by a new one, opened on `route`.
pub async fn worker(
    name: String,
    target: Target,
    route: Route,
    w: Workload,
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    sessions: Sessions,
) {
    let (addr, direct) = match route {
        Route::Direct(a) => (a, true),
        Route::Proxied(a) => (a, false),
    };
    let mut session: Option<Session> = None;
    let mut turn = 0u64;
    while !stop.load(Ordering::SeqCst) {
        turn += 1;
        let s = match &session {
            Some(s) if !matches!(s.state(), SessionState::Lost(_)) => s.clone(),
            _ => match open(&target, &addr, &w).await {
                Some(s) => {
                    sessions.lock().unwrap().push((direct, s.clone()));
                    session = Some(s.clone());
                    s
                }
                None => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let id = rec.begin(format!("{name}/{}", s.id()), false);
        let acquired = w
            .primitive
            .acquire(&s, &w.lock, turn, false, w.acquire_timeout)
            .await;
        match acquired {
            Ok(g) => {
                rec.granted(id, g.token(), g.shared());
                let lost = g.lost();
                tokio::pin!(lost);
                let mut was_lost = !g.is_held();
                if !was_lost {
                    rec.resource.access(&g);
                    tokio::select! {
                        _ = &mut lost => was_lost = true,
                        _ = tokio::time::sleep(w.hold) => {}
                    }
                    if !was_lost && g.is_held() {
                        rec.resource.access(&g);
                    }
                }
                if was_lost || !g.is_held() {
                    rec.ended(id, true);
                    drop(g);
                } else {
                    rec.ended(id, false);
                    let _ = g.release().await;
                }
            }
            Err(e) => {
                let timeout = matches!(e, Error::Timeout { .. });
                rec.failed(
                    id,
                    if timeout {
                        "timeout".into()
                    } else {
                        e.to_string()
                    },
                );
                if !timeout {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Opens a session on `addr`, bounded by the acquisition timeout.
async fn open(target: &Target, addr: &str, w: &Workload) -> Option<Session> {
    let opened = tokio::time::timeout(w.acquire_timeout, async {
        Session::builder(target.try_backend_at(addr).await?)
            .namespace(w.namespace.as_str())
            .ttl(w.ttl)
            .start()
            .await
    })
    .await;
    opened.ok()?.ok()
}

/// A worker in a child process (`holder work ...`), so that the test can SIGSTOP it. Its
/// writes reach the resource when the test reads them from the child's stdout: a paused
/// child's late write arrives late, as it would over a network.
#[derive(Debug)]
pub struct ChildWorker {
    child: ManagedChild,
    reader: Option<std::thread::JoinHandle<()>>,
    /// The token the child announced as granted and not yet ended (to pause it while holding).
    pub holding: Arc<Mutex<Option<u64>>>,
}

impl ChildWorker {
    /// Starts `bin [prefix] work <kind> <endpoints> <ns> <lock> <ttl-ms> <hold-ms> <timeout-ms>`.
    pub fn start(
        bin: &str,
        prefix: &[&str],
        target: &Target,
        w: &Workload,
        rec: Arc<Recorder>,
    ) -> ChildWorker {
        let mut child = Command::new(bin)
            .args(prefix)
            .args([
                "work",
                target.kind.arg(),
                &target.endpoint,
                &w.namespace,
                &w.lock,
            ])
            .arg(w.ttl.as_millis().to_string())
            .arg(w.hold.as_millis().to_string())
            .arg(w.acquire_timeout.as_millis().to_string())
            .args(["--primitive", &w.primitive.arg()])
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start child worker");
        let out = child.stdout.take().expect("stdout");
        let log = std::env::temp_dir().join(format!("fencelock-worker-{}.log", std::process::id()));
        let child = ManagedChild::adopt("child worker", child, &log);
        let holding = Arc::new(Mutex::new(None));
        let h = holding.clone();
        let (fenced, shared) = (
            w.primitive.fenced(),
            matches!(w.primitive, Primitive::Semaphore(_)),
        );
        let reader = std::thread::spawn(move || {
            let mut current: Option<usize> = None;
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let mut it = line.split_whitespace();
                let (Some(tag), Some(token)) =
                    (it.next(), it.next().and_then(|t| t.parse::<u64>().ok()))
                else {
                    continue;
                };
                match tag {
                    "G" => {
                        let id = rec.begin("child".into(), true);
                        rec.granted(id, token, shared);
                        current = Some(id);
                        *h.lock().unwrap() = Some(token);
                    }
                    "W" if fenced => {
                        rec.resource.write(token);
                    }
                    "E" => {
                        *h.lock().unwrap() = None;
                        if let Some(id) = current.take() {
                            rec.ended(id, false);
                        }
                    }
                    _ => {}
                }
            }
        });
        ChildWorker {
            child,
            reader: Some(reader),
            holding,
        }
    }

    /// Pauses the child (SIGSTOP).
    pub fn pause(&mut self) {
        self.child.pause();
    }

    /// Resumes the child (SIGCONT).
    pub fn resume(&mut self) {
        self.child.resume();
    }

    /// Whether the child exited by itself (it never should: it loops until killed).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait()
    }

    /// Stops the child (SIGKILL), reaps it and waits for its output.
    pub fn stop(mut self) {
        self.child.kill();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// The body of `holder work <kind> <endpoints> <ns> <lock> <ttl-ms> <hold-ms> <timeout-ms>
/// [--primitive P]`: loops acquire (a write lock of a read-write lock) → `G token` → wait
/// `hold` → `W token` → release → `E token` until killed.
pub async fn run_child_worker(kind: Kind, endpoint: &str, w: &Workload) {
    use std::io::Write;
    let target = Target::new(kind, endpoint);
    let mut out = std::io::stdout();
    let mut session: Option<Session> = None;
    loop {
        let s = match &session {
            Some(s) if !matches!(s.state(), SessionState::Lost(_)) => s.clone(),
            _ => match open(&target, endpoint, w).await {
                Some(s) => {
                    session = Some(s.clone());
                    s
                }
                None => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        match w
            .primitive
            .acquire(&s, &w.lock, 0, true, w.acquire_timeout)
            .await
        {
            Ok(g) => {
                let t = g.token();
                let _ = writeln!(out, "G {t}");
                let _ = out.flush();
                tokio::time::sleep(w.hold).await;
                // Written even if lost meanwhile: a paused process does not know yet. The
                // fence must refuse it.
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
