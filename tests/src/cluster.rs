//! A 3-member etcd cluster on distinct loopback ports with temporary data dirs, whose members
//! the tests kill, restart and pause. Everything started is stopped by PID on drop.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    paused: bool,
}

/// A 3-member etcd cluster.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    initial: String,
}

impl EtcdCluster {
    /// Starts three members and waits (bounded) until each accepts connections.
    pub fn start() -> EtcdCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let members: Vec<Member> = (0..3)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
                paused: false,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = EtcdCluster {
            members,
            dir,
            initial,
        };
        for i in 0..3 {
            c.spawn(i);
        }
        for i in 0..3 {
            c.wait_up(i);
        }
        c
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", m.name)))
            .expect("log");
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(self.dir.path().join(&m.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd member");
        self.members[i].child = Some(child);
        self.members[i].paused = false;
    }

    fn wait_up(&mut self, i: usize) {
        let port = self.members[i].client_port;
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "member {i} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every member's client endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        (0..3).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client endpoint.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Restarts a killed member `i` on its data dir.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} is running");
        self.spawn(i);
        self.wait_up(i);
    }

    /// Pauses (`STOP`) or resumes (`CONT`) member `i`.
    pub fn signal(&mut self, i: usize, sig: &str) {
        if let Some(c) = &self.members[i].child {
            let _ = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(c.id().to_string())
                .status();
            self.members[i].paused = sig == "STOP";
        }
    }

    /// The index of the current leader, asking the live members (bounded wait for one).
    pub async fn leader(&self) -> usize {
        let start = Instant::now();
        loop {
            let mut ids = Vec::new();
            let mut leader = None;
            for i in 0..3 {
                if self.members[i].child.is_none() || self.members[i].paused {
                    ids.push(None);
                    continue;
                }
                let status = async {
                    let mut c = etcd_client::Client::connect([self.endpoint(i)], None).await?;
                    c.status().await
                };
                match tokio::time::timeout(Duration::from_secs(2), status).await {
                    Ok(Ok(s)) => {
                        ids.push(s.header().map(|h| h.member_id()));
                        if s.leader() != 0 {
                            leader = Some(s.leader());
                        }
                    }
                    _ => ids.push(None),
                }
            }
            if let Some(l) = leader {
                if let Some(i) = ids.iter().position(|id| *id == Some(l)) {
                    return i;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no leader elected"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..3 {
            self.signal(i, "CONT");
            self.kill(i);
        }
    }
}
