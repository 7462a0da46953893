//! A 3-server ZooKeeper ensemble on distinct loopback ports (client, quorum and election port
//! per server) with temporary data dirs, started from Debian's `zookeeper` package the way
//! [`crate::zookeeper`] starts its single server; the tests kill, restart and pause its
//! servers. Everything started is stopped by PID on drop, and a guard process per server
//! kills it if the test process dies first.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::faults::{Kind, Target};
use crate::free_port;
use crate::zookeeper::{
    java, orphan_guard, server_command, MAX_SESSION_TIMEOUT, MIN_SESSION_TIMEOUT, START_TIMEOUT,
    TICK,
};

/// The servers of the ensemble.
const SIZE: usize = 3;

/// How long [`ZkEnsemble::leader`] waits for a server to say it leads.
const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The main class of a server of an ensemble.
const QUORUM_MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

struct Server {
    /// `myid`, 1-based.
    id: usize,
    client_port: u16,
    quorum_port: u16,
    election_port: u16,
    child: Option<Child>,
    guard: Option<Child>,
    paused: bool,
}

/// A 3-server ZooKeeper ensemble (tickTime 500 ms: sessions from 1 s; admin server off; every
/// four-letter-word command enabled).
pub struct ZkEnsemble {
    servers: Vec<Server>,
    java: PathBuf,
    dir: tempfile::TempDir,
}

impl ZkEnsemble {
    /// Starts three servers, waits (bounded) until each answers `ruok` and one of them leads.
    /// Panics if the ensemble cannot start.
    pub fn start() -> ZkEnsemble {
        let mut last = String::new();
        // Ports picked free may be taken before the servers bind them: try a few times.
        for _ in 0..3 {
            match Self::try_start() {
                Ok(e) => return e,
                Err(err) => last = err,
            }
        }
        panic!("cannot start the ZooKeeper ensemble: {last}");
    }

    fn try_start() -> Result<ZkEnsemble, String> {
        let java = java().ok_or("java not found")?;
        let dir = tempfile::Builder::new()
            .prefix("fencelock-zk-ensemble-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let servers: Vec<Server> = (0..SIZE)
            .map(|i| Server {
                id: i + 1,
                client_port: free_port(),
                quorum_port: free_port(),
                election_port: free_port(),
                child: None,
                guard: None,
                paused: false,
            })
            .collect();
        let peers: String = servers
            .iter()
            .map(|s| {
                format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    s.id, s.quorum_port, s.election_port
                )
            })
            .collect();
        for s in &servers {
            let home = dir.path().join(format!("s{}", s.id));
            let data = home.join("data");
            std::fs::create_dir_all(&data).map_err(|e| format!("data dir: {e}"))?;
            std::fs::write(data.join("myid"), format!("{}\n", s.id))
                .map_err(|e| format!("myid: {e}"))?;
            std::fs::write(
                home.join("zoo.cfg"),
                format!(
                    "tickTime={tick}\n\
                     initLimit=10\n\
                     syncLimit=5\n\
                     minSessionTimeout={min}\n\
                     maxSessionTimeout={max}\n\
                     dataDir={data}\n\
                     clientPort={port}\n\
                     clientPortAddress=127.0.0.1\n\
                     maxClientCnxns=0\n\
                     admin.enableServer=false\n\
                     4lw.commands.whitelist=*\n\
                     {peers}",
                    tick = TICK.as_millis(),
                    min = MIN_SESSION_TIMEOUT.as_millis(),
                    max = MAX_SESSION_TIMEOUT.as_millis(),
                    data = data.display(),
                    port = s.client_port,
                ),
            )
            .map_err(|e| format!("zoo.cfg: {e}"))?;
        }
        let mut e = ZkEnsemble { servers, java, dir };
        for i in 0..SIZE {
            e.spawn(i)?;
        }
        for i in 0..SIZE {
            e.wait_up(i)?;
        }
        let start = Instant::now();
        while !(0..SIZE).any(|i| is_leader(&four_letter_blocking(e.servers[i].client_port, "srvr")))
        {
            if start.elapsed() > LEADER_TIMEOUT {
                return Err(format!(
                    "no leader within {LEADER_TIMEOUT:?}: {}",
                    e.log_tail(0)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(e)
    }

    fn home(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("s{}", self.servers[i].id))
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let home = self.home(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(home.join("zookeeper.log"))
            .map_err(|e| format!("log file: {e}"))?;
        let child = server_command(&self.java, QUORUM_MAIN)
            .arg(home.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn java: {e}"))?;
        let s = &mut self.servers[i];
        s.guard = orphan_guard(child.id());
        s.child = Some(child);
        s.paused = false;
        Ok(())
    }

    /// Waits (bounded) until server `i` answers `ruok` (it may not serve yet: that needs a
    /// quorum).
    fn wait_up(&mut self, i: usize) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Some(Ok(Some(status))) = self.servers[i].child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "server {i} exited ({status}): {}",
                    self.log_tail(i)
                ));
            }
            if four_letter_blocking(self.servers[i].client_port, "ruok").as_deref() == Some("imok")
            {
                return Ok(());
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "server {i} did not answer within {START_TIMEOUT:?}: {}",
                    self.log_tail(i)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The tail of server `i`'s log, for failure messages.
    pub fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(self.home(i).join("zookeeper.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Every server's client address, comma-separated: the connect string.
    pub fn connect_string(&self) -> String {
        (0..SIZE)
            .map(|i| self.endpoint(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Server `i`'s client address, `127.0.0.1:PORT`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.servers[i].client_port)
    }

    /// Kills server `i` (SIGKILL by its PID).
    pub fn kill(&mut self, i: usize) {
        let s = &mut self.servers[i];
        // The guard first, so that it can never signal a recycled PID.
        if let Some(mut g) = s.guard.take() {
            let _ = g.kill();
            let _ = g.wait();
        }
        if let Some(mut c) = s.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        s.paused = false;
    }

    /// Restarts a killed server `i` on its data dir and waits (bounded) until it answers
    /// `ruok`. It serves clients once it has joined a quorum.
    pub fn restart(&mut self, i: usize) {
        assert!(self.servers[i].child.is_none(), "server {i} is running");
        let res = self.spawn(i).and_then(|()| self.wait_up(i));
        if let Err(e) = res {
            panic!("cannot restart ZooKeeper server {i}: {e}");
        }
    }

    /// Pauses (`STOP`) or resumes (`CONT`) server `i`, by its PID.
    pub fn signal(&mut self, i: usize, sig: &str) {
        if let Some(c) = &self.servers[i].child {
            let _ = std::process::Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(c.id().to_string())
                .status();
            self.servers[i].paused = sig == "STOP";
        }
    }

    /// Sends a four-letter-word command to server `i` and returns the answer, or `None` if it
    /// does not answer within 2 s.
    pub async fn four_letter(&self, i: usize, cmd: &str) -> Option<String> {
        four_letter(self.servers[i].client_port, cmd).await
    }

    /// The index of the current leader: asks every live server with `srvr` for its mode
    /// (bounded wait for one that says `leader`).
    pub async fn leader(&self) -> usize {
        let start = Instant::now();
        loop {
            for (i, s) in self.servers.iter().enumerate() {
                if s.child.is_none() || s.paused {
                    continue;
                }
                if is_leader(&four_letter(s.client_port, "srvr").await) {
                    return i;
                }
            }
            assert!(
                start.elapsed() < LEADER_TIMEOUT,
                "no ZooKeeper leader within {LEADER_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        for i in 0..SIZE {
            self.signal(i, "CONT");
            self.kill(i);
        }
    }
}

/// Whether a `srvr` answer says `Mode: leader`.
fn is_leader(srvr: &Option<String>) -> bool {
    srvr.as_deref()
        .is_some_and(|a| a.lines().any(|l| l.trim() == "Mode: leader"))
}

/// `cmd` to the server on `port`, bounded (1 s to connect, 2 s in all).
async fn four_letter(port: u16, cmd: &str) -> Option<String> {
    let ask = async {
        let mut s = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        .ok()?
        .ok()?;
        s.write_all(cmd.as_bytes()).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
}

/// The blocking form of [`four_letter`], for the synchronous start and restart.
fn four_letter_blocking(port: u16, cmd: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr = ([127, 0, 0, 1], port).into();
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(cmd.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[async_trait::async_trait]
impl crate::scenarios::Cluster for ZkEnsemble {
    fn target(&self) -> Target {
        Target {
            kind: Kind::ZooKeeper,
            endpoint: self.connect_string(),
        }
    }
    fn member(&self, i: usize) -> String {
        self.endpoint(i)
    }
    async fn leader(&self) -> usize {
        ZkEnsemble::leader(self).await
    }
    fn kill(&mut self, i: usize) {
        ZkEnsemble::kill(self, i)
    }
    fn restart(&mut self, i: usize) {
        ZkEnsemble::restart(self, i)
    }
}
