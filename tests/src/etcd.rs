//! A real etcd server for the tests (the `etcd` binary from PATH, Debian's `etcd-server`), on
//! free loopback ports with a temporary data dir; and the conformance [`Factory`] over it.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fencelock::backend::Backend;
use fencelock::conformance::Factory;
use fencelock::Result;
use fencelock_etcd::EtcdBackend;

use crate::{free_port, in_ci};

/// Whether the `etcd` binary is on PATH.
pub fn installed() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the etcd tests can run. Without etcd: panics in CI, else prints a skip message.
pub fn available() -> bool {
    if installed() {
        return true;
    }
    let msg = "etcd is not installed (Debian package `etcd-server`)";
    if in_ci() {
        panic!("{msg}: required in CI");
    }
    eprintln!("skipped: {msg}");
    false
}

/// A running single-member etcd; killed by its PID when dropped.
#[derive(Debug)]
pub struct EtcdServer {
    child: Child,
    client_port: u16,
    _dir: tempfile::TempDir,
}

impl EtcdServer {
    /// Starts etcd on free loopback ports and waits (bounded) until it accepts connections.
    pub fn start() -> EtcdServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let (client_port, peer_port) = (free_port(), free_port());
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log file");
        let child = Command::new("etcd")
            .args(["--name", "n0", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("n0={peer}")])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let mut server = EtcdServer {
            child,
            client_port,
            _dir: dir,
        };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", client_port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("etcd exited at start: {status}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "etcd did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// The client endpoint, `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server shared by the tests of one test binary that run at the same time: started by
/// the first, stopped when the last drops it.
pub fn shared() -> Option<Arc<EtcdServer>> {
    static SHARED: Mutex<Weak<EtcdServer>> = Mutex::new(Weak::new());
    if !available() {
        return None;
    }
    let mut slot = SHARED.lock().unwrap();
    if let Some(s) = slot.upgrade() {
        return Some(s);
    }
    let s = Arc::new(EtcdServer::start());
    *slot = Arc::downgrade(&s);
    Some(s)
}

/// Connects to `endpoint`, retrying (bounded) while the server elects itself leader.
pub async fn connect(endpoint: &str) -> EtcdBackend {
    connect_all(&[endpoint]).await
}

/// Connects to a cluster's `endpoints`, retrying (bounded) while it elects a leader.
pub async fn connect_all(endpoints: &[&str]) -> EtcdBackend {
    let start = Instant::now();
    loop {
        match EtcdBackend::connect(endpoints).await {
            Ok(b) => return b,
            Err(e) if start.elapsed() < Duration::from_secs(30) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot connect to etcd at {endpoints:?}: {e}"),
        }
    }
}

/// The conformance factory over a (shared) etcd server.
pub struct EtcdFactory {
    backend: EtcdBackend,
    /// Keeps the server running while the test runs.
    pub server: Arc<EtcdServer>,
}

impl EtcdFactory {
    /// A factory over the shared server; `None` if etcd is missing outside CI.
    pub async fn shared() -> Option<EtcdFactory> {
        let server = shared()?;
        let backend = connect(&server.endpoint()).await;
        Some(EtcdFactory { backend, server })
    }

    /// The connected backend.
    pub fn etcd(&self) -> &EtcdBackend {
        &self.backend
    }
}

#[async_trait::async_trait]
impl Factory for EtcdFactory {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }

    fn short_ttl(&self) -> Duration {
        fencelock_etcd::MIN_TTL
    }

    async fn delete_as_admin(&self, key: &str) -> Result<()> {
        self.backend
            .client()
            .kv_client()
            .delete(key, None)
            .await
            .map(drop)
            .map_err(|e| fencelock::Error::backend("etcd", "admin delete", false, e))
    }
}
