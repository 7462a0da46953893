//! A Redis primary with two replicas, watched by three `redis-server --sentinel` processes on
//! loopback ports: Sentinel as people deploy it, failing over by itself when the primary dies
//! (or when told to, `SENTINEL FAILOVER`). Clients find the primary through the sentinels
//! (`redis+sentinel://…/fl`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::redis::{Durability, RedisServer};
use crate::pki::TestPki;
use crate::process::ManagedChild;
use crate::target::{Kind, Target};

/// The master name the sentinels monitor.
pub const MASTER: &str = "fl";

/// How long the sentinels wait before they call a silent primary down: short, for tests,
/// though not so short that a loaded machine fails over by mistake. At 1 s it did: a second
/// after a failover, the sentinels' fresh links to the new primary had no answer yet on a
/// loaded machine, they called it down and promoted the other replica, and the demoted one,
/// still a primary, became a replica only when the sentinels converted it, 8–10 s later
/// (Sentinel's own delay): no write could be acknowledged by a replica meanwhile, and the
/// holder's session in `sentinel_killed_primary_keeps_sessions_and_locks` was lost by its
/// deadline (CI runs 66 and 67, and once in 39 runs of its file here beside a build).
pub const DOWN_AFTER: Duration = Duration::from_millis(3000);

/// How a failover is made when the harness "kills" the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failover {
    /// The primary is SIGKILLed; the sentinels notice and promote a replica.
    Kill,
    /// `SENTINEL FAILOVER`: the primary keeps running and is demoted to a replica.
    Command,
    /// The primary is paused (SIGSTOP), as a suspended host is: its connections stay open and
    /// nothing is answered; the sentinels notice and promote a replica. Resumed, it is
    /// demoted to a replica.
    Pause,
}

/// One `redis-server --sentinel`; killed (by PID) when dropped.
#[derive(Debug)]
struct SentinelProcess {
    child: ManagedChild,
    port: u16,
    _dir: tempfile::TempDir,
}

/// The files sentinels need to speak TLS, and `redis-cli` to talk to them.
#[derive(Debug, Clone)]
struct SentinelTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

/// Three Redis servers (a primary, two replicas) and three sentinels.
#[derive(Debug)]
pub struct SentinelGroup {
    servers: [RedisServer; 3],
    sentinels: Vec<SentinelProcess>,
    tls: Option<SentinelTls>,
    /// The sentinels' `requirepass`, if any.
    password: Option<String>,
    failover: Failover,
    /// How many replicas the harness's clients wait for at each grant and heartbeat.
    acks: usize,
    /// The servers killed and not yet restarted.
    down: Mutex<Vec<usize>>,
    /// The primaries paused ([`Failover::Pause`]) and not yet resumed.
    paused: Mutex<Vec<usize>>,
}

impl SentinelGroup {
    /// Starts the servers (AOF, `appendfsync always`), waits until the replicas are in sync,
    /// then the sentinels, and waits (bounded) until every sentinel knows both replicas and
    /// the other sentinels. Blocking.
    /// The harness's clients (see [`Target`]) wait for `acks` replicas (1 or 2).
    pub fn start(failover: Failover, acks: usize) -> SentinelGroup {
        let primary = RedisServer::start(Durability::FsyncAlways);
        let replicas = [0, 1].map(|_| {
            let r = RedisServer::replica_with(&primary, Durability::FsyncAlways);
            r.wait_in_sync();
            r
        });
        let [a, b] = replicas;
        Self::with([primary, a, b], None, None, failover, acks)
    }

    /// Like [`start`](Self::start) (failing over by `SENTINEL FAILOVER`, one acknowledging
    /// replica), with sentinels that ask for `password` (`requirepass`). Blocking.
    pub fn start_protected(password: &str) -> SentinelGroup {
        let primary = RedisServer::start(Durability::None);
        let replicas = [0, 1].map(|_| {
            let r = RedisServer::replica_of(&primary);
            r.wait_in_sync();
            r
        });
        let [a, b] = replicas;
        let password = Some(password.to_string());
        Self::with([primary, a, b], None, password, Failover::Command, 1)
    }

    /// The same over TLS only, servers and sentinels (certificates of `pki`; replication and
    /// Sentinel's own connections over TLS too), with the ACL user `app` (password `app-pw`)
    /// on the servers; no persistence. Blocking.
    pub fn start_tls(pki: &TestPki, failover: Failover, acks: usize) -> SentinelGroup {
        let primary = RedisServer::start_tls(pki, false);
        let replicas = [0, 1].map(|_| {
            let r = RedisServer::start_tls_with(pki, false, Some(primary.port()));
            r.wait_in_sync();
            r
        });
        let [a, b] = replicas;
        let server = pki.server();
        let tls = SentinelTls {
            cert: server.cert,
            key: server.key,
            ca: pki.ca(),
        };
        Self::with([primary, a, b], Some(tls), None, failover, acks)
    }

    fn with(
        servers: [RedisServer; 3],
        tls: Option<SentinelTls>,
        password: Option<String>,
        failover: Failover,
        acks: usize,
    ) -> SentinelGroup {
        let sentinels = (0..3)
            .map(|_| start_sentinel(servers[0].port(), tls.as_ref(), password.as_deref()))
            .collect::<Vec<_>>();
        let group = SentinelGroup {
            servers,
            sentinels,
            tls,
            password,
            failover,
            acks,
            down: Mutex::default(),
            paused: Mutex::default(),
        };
        group.wait_known();
        group
    }

    /// `redis+sentinel://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/fl` (`rediss+sentinel://` over
    /// TLS).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// Server `i`.
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// The sentinels' events (`+sdown`, `+odown`, `+failover-*`, `+switch-master`…), the last
    /// `lines` of each log, and the servers' ports, for failure messages: which server the
    /// sentinels promoted, when, and whether twice.
    pub fn sentinel_logs(&self, lines: usize) -> String {
        let ports: Vec<u16> = self.servers.iter().map(|s| s.port()).collect();
        let mut out = format!("servers' ports {ports:?}");
        for (i, s) in self.sentinels.iter().enumerate() {
            out.push_str(&format!("\nsentinel {i}:\n{}", s.child.log_tail(lines)));
        }
        out
    }

    /// Runs `redis-cli` against sentinel `i` (blocking).
    pub fn sentinel_cli(&self, i: usize, args: &[&str]) -> String {
        let out = cli(
            self.sentinels[i].port,
            self.tls.as_ref(),
            self.password.as_deref(),
        )
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
        out.trim().to_string()
    }

    /// The port of the primary as a majority of the sentinels name it, if they agree.
    fn named_primary(&self) -> Option<u16> {
        let mut votes: Vec<(u16, usize)> = Vec::new();
        for i in 0..self.sentinels.len() {
            let out = self.sentinel_cli(i, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]);
            let Some(port) = out
                .lines()
                .nth(1)
                .and_then(|p| p.trim().parse::<u16>().ok())
            else {
                continue;
            };
            match votes.iter_mut().find(|(p, _)| *p == port) {
                Some((_, n)) => *n += 1,
                None => votes.push((port, 1)),
            }
        }
        votes
            .into_iter()
            .find(|(_, n)| *n * 2 > self.sentinels.len())
            .map(|(p, _)| p)
    }

    /// The index of the primary the sentinels name (bounded wait for a majority). Blocking.
    pub fn primary_index(&self) -> usize {
        let start = Instant::now();
        loop {
            if let Some(port) = self.named_primary() {
                if let Some(i) = self.servers.iter().position(|s| s.port() == port) {
                    return i;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the sentinels name no primary"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (bounded) until the sentinels name a primary other than server `old`, and that
    /// server says it is a primary; returns how long that took. Blocking.
    pub fn wait_failed_over(&self, old: usize) -> Duration {
        let start = Instant::now();
        loop {
            if let Some(port) = self.named_primary() {
                let i = self.servers.iter().position(|s| s.port() == port);
                if let Some(i) = i.filter(|i| *i != old) {
                    if self.servers[i]
                        .cli(&["ROLE"])
                        .unwrap_or_default()
                        .starts_with("master")
                    {
                        return start.elapsed();
                    }
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no failover from server {old}: {}",
                self.sentinel_cli(0, &["SENTINEL", "MASTER", MASTER])
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asks sentinel 0 to fail over now (`SENTINEL FAILOVER`), retrying (bounded) while a
    /// failover is already under way or the replicas are not yet known.
    pub fn command_failover(&self) {
        let start = Instant::now();
        loop {
            let out = self.sentinel_cli(0, &["SENTINEL", "FAILOVER", MASTER]);
            if out == "OK" {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "SENTINEL FAILOVER: {out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (bounded) until every sentinel sees the two replicas of the current primary and
    /// the two other sentinels: before that, a failover may find no replica, or no quorum.
    pub fn wait_known(&self) {
        let start = Instant::now();
        loop {
            let ready = (0..self.sentinels.len()).all(|i| {
                let info = self.sentinel_cli(i, &["SENTINEL", "MASTER", MASTER]);
                let field = |name: &str| {
                    let mut lines = info.lines();
                    lines
                        .position(|l| l.trim() == name)
                        .and_then(|_| lines.next())
                        .and_then(|v| v.trim().parse::<usize>().ok())
                };
                field("num-slaves") >= Some(2) && field("num-other-sentinels") >= Some(2)
            });
            if ready {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the sentinels did not find each other and the replicas: {}",
                self.sentinel_cli(0, &["SENTINEL", "MASTER", MASTER])
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `redis-cli` for the sentinel on `port`.
fn cli(port: u16, tls: Option<&SentinelTls>, password: Option<&str>) -> Command {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(pw) = password {
        cmd.args(["--no-auth-warning", "-a", pw]);
    }
    if let Some(tls) = tls {
        cmd.arg("--tls").arg("--cacert").arg(&tls.ca);
    }
    cmd
}

fn start_sentinel(
    primary: u16,
    tls: Option<&SentinelTls>,
    password: Option<&str>,
) -> SentinelProcess {
    let dir = super::data_dir("fencelock-sentinel-").expect("temp dir");
    let port = crate::free_port();
    let conf = dir.path().join("sentinel.conf");
    let ports = match tls {
        None => format!("port {port}\n"),
        Some(t) => format!(
            "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-auth-clients no\ntls-replication yes\n",
            t.cert.display(),
            t.key.display(),
            t.ca.display()
        ),
    };
    let ports = match password {
        // Sentinels also log in to each other with it.
        Some(pw) => format!("{ports}requirepass {pw}\n"),
        None => ports,
    };
    let text = format!(
        "{ports}bind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\n\
         sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
         sentinel down-after-milliseconds {MASTER} {down}\n\
         sentinel failover-timeout {MASTER} 5000\n\
         sentinel parallel-syncs {MASTER} 2\n",
        dir = dir.path().display(),
        down = DOWN_AFTER.as_millis(),
    );
    std::fs::write(&conf, text).expect("write sentinel.conf");
    let mut cmd = Command::new("redis-server");
    cmd.arg(&conf).arg("--sentinel");
    let child = ManagedChild::spawn(
        format!("sentinel-{port}"),
        cmd,
        &dir.path().join("sentinel.log"),
    )
    .expect("start redis-server --sentinel");
    let start = Instant::now();
    loop {
        let out = cli(port, tls, password).arg("PING").output();
        if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the sentinel did not answer: {}",
            child.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    SentinelProcess {
        child,
        port,
        _dir: dir,
    }
}

#[async_trait::async_trait]
impl super::Cluster for SentinelGroup {
    fn kind(&self) -> Kind {
        Kind::Redis
    }

    fn size(&self) -> usize {
        3
    }

    fn endpoint(&self, i: usize) -> String {
        self.servers[i].addr()
    }

    /// Clients find the primary through the sentinels, and wait for the group's number of
    /// replicas (`#acks=N`, which the harness reads; see [`Target::try_backend_at`]).
    fn target(&self) -> Target {
        Target::new(Kind::Redis, format!("{}#acks={}", self.url(), self.acks))
    }

    /// The primary the sentinels name.
    async fn leader(&self) -> usize {
        tokio::task::block_in_place(|| self.primary_index())
    }

    /// Killing the primary fails over through the sentinels (a SIGKILL, a SIGSTOP, or
    /// `SENTINEL FAILOVER`, which leaves it running, as the group was started to do), and returns once
    /// they named another primary and it says so; killing a replica only kills it.
    fn kill(&self, i: usize) {
        tokio::task::block_in_place(|| {
            let primary = self.primary_index();
            if i != primary {
                self.servers[i].kill();
                self.down.lock().unwrap().push(i);
                return;
            }
            match self.failover {
                Failover::Kill => {
                    self.servers[i].kill();
                    self.down.lock().unwrap().push(i);
                }
                Failover::Pause => {
                    self.servers[i].pause();
                    self.paused.lock().unwrap().push(i);
                }
                Failover::Command => self.command_failover(),
            }
            let took = self.wait_failed_over(i);
            println!(
                "redis sentinel: primary {i} failed over ({:?}) after {took:.2?}",
                self.failover
            );
            // Before the next fault: every sentinel sees the new primary's replicas.
            if self.failover == Failover::Command {
                self.wait_known();
            }
        });
    }

    /// Restarts a killed server as a replica of the primary the sentinels name (as Sentinel
    /// reconfigures a returning primary), resumes a paused one (which the sentinels then
    /// demote); a running one (demoted by `SENTINEL FAILOVER`) is left as it is.
    fn restart(&self, i: usize) {
        let took = |list: &Mutex<Vec<usize>>| {
            let mut list = list.lock().unwrap();
            let at = list.iter().position(|d| *d == i);
            at.map(|at| list.remove(at)).is_some()
        };
        let (was_down, was_paused) = (took(&self.down), took(&self.paused));
        if !was_down && !was_paused {
            return;
        }
        tokio::task::block_in_place(|| {
            let primary = self.primary_index();
            let of = (primary != i).then(|| self.servers[primary].port());
            if was_paused && !was_down {
                // The sentinels make it a replica of the new primary.
                self.servers[i].resume();
            } else {
                self.servers[i].restart_as(of);
            }
            if of.is_some() {
                self.servers[i].wait_in_sync();
            }
            self.wait_known();
        });
    }

    fn pause(&self, i: usize) {
        self.servers[i].pause();
    }

    fn resume(&self, i: usize) {
        self.servers[i].resume();
    }

    async fn dump(&self, namespace: &str) -> String {
        let p = tokio::task::block_in_place(|| self.primary_index());
        self.servers[p]
            .cli(&["--scan", "--pattern", &format!("fencelock:*{namespace}*")])
            .unwrap_or_default()
    }
}
