//! A real single-node ZooKeeper server for the tests, from Debian's `zookeeper` package
//! (jars in `/usr/share/java`, needs Java), on a free loopback port with a temporary data
//! directory; and the conformance [`Factory`] over it.
//!
//! ```ignore
//! let Some(server) = fencelock_integration::zookeeper::shared() else { return }; // skipped
//! let backend = ZooKeeperBackend::connect(&server.connect_string()).await?;
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fencelock::backend::Backend;
use fencelock::conformance::Factory;
use fencelock::Result;
use fencelock_zookeeper::ZooKeeperBackend;

use crate::{free_port, in_ci};

/// The server's tick: sessions may last from 2 ticks (1 s) up to `maxSessionTimeout`.
pub const TICK: Duration = Duration::from_millis(500);

/// The smallest session timeout the test server grants (2 × [`TICK`]).
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(1000);

/// The largest session timeout the test server grants.
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a server may take to answer `ruok` after its start.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);

const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// A logging backend for slf4j (ZooKeeper logs through it); the server runs without one too.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// Whether Java and Debian's `zookeeper` package are installed.
pub fn installed() -> bool {
    Path::new(ZOOKEEPER_JAR).exists() && java().is_some()
}

pub(crate) fn java() -> Option<PathBuf> {
    let candidates = std::env::var_os("JAVA_HOME")
        .map(|h| PathBuf::from(h).join("bin/java"))
        .into_iter()
        .chain([PathBuf::from("/usr/bin/java")]);
    candidates.into_iter().find(|p| p.exists())
}

/// Whether the ZooKeeper tests can run: `true` if the server is installed. Otherwise, panics
/// when `CI=true` (in CI a missing server is a failure), else prints a skip message and
/// returns `false`.
pub fn available() -> bool {
    if installed() {
        return true;
    }
    let msg = "ZooKeeper is not installed (Debian packages `zookeeper` and a JRE)";
    if in_ci() {
        panic!("{msg}: required in CI");
    }
    eprintln!("skipped: {msg}");
    false
}

/// A running single-node ZooKeeper server; killed (by its PID) when dropped. A small
/// `sh` guard process kills it too if the test process dies without dropping it (killed by a
/// timeout, say), so that no JVM is left behind.
#[derive(Debug)]
pub struct ZkServer {
    child: Child,
    guard: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl ZkServer {
    /// Starts a server on a free loopback port and waits until it answers (bounded). Panics
    /// if it cannot start.
    pub fn start() -> ZkServer {
        let mut last = String::new();
        // A port picked free may be taken before the server binds it: try a few.
        for _ in 0..3 {
            match Self::try_start() {
                Ok(server) => return server,
                Err(e) => last = e,
            }
        }
        panic!("cannot start ZooKeeper: {last}");
    }

    fn try_start() -> Result<ZkServer, String> {
        let java = java().ok_or("java not found")?;
        let dir = tempfile::Builder::new()
            .prefix("fencelock-zk-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let data = dir.path().join("data");
        std::fs::create_dir(&data).map_err(|e| format!("data dir: {e}"))?;
        let port = free_port();
        let cfg = dir.path().join("zoo.cfg");
        std::fs::write(
            &cfg,
            format!(
                "tickTime={tick}\n\
                 minSessionTimeout={min}\n\
                 maxSessionTimeout={max}\n\
                 dataDir={data}\n\
                 clientPort={port}\n\
                 clientPortAddress=127.0.0.1\n\
                 maxClientCnxns=0\n\
                 admin.enableServer=false\n\
                 4lw.commands.whitelist=*\n",
                tick = TICK.as_millis(),
                min = MIN_SESSION_TIMEOUT.as_millis(),
                max = MAX_SESSION_TIMEOUT.as_millis(),
                data = data.display(),
            ),
        )
        .map_err(|e| format!("zoo.cfg: {e}"))?;
        let log = std::fs::File::create(dir.path().join("zookeeper.log"))
            .map_err(|e| format!("log file: {e}"))?;
        let child = server_command(&java, "org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn java: {e}"))?;
        let guard = orphan_guard(child.id());
        let mut server = ZkServer {
            child,
            guard,
            port,
            dir,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("the server exited ({status}): {}", self.log_tail()));
            }
            if self.four_letter("ruok").as_deref() == Some("imok") {
                return Ok(());
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "no answer on port {} within {START_TIMEOUT:?}: {}",
                    self.port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends a four-letter-word command (`ruok`, `srvr`, `cons`, `dump`, ...) and returns the
    /// answer, or `None` if the server does not answer.
    pub fn four_letter(&self, cmd: &str) -> Option<String> {
        let addr = ([127, 0, 0, 1], self.port).into();
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(cmd.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    /// The tail of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Where the server logs.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("zookeeper.log")
    }

    /// The connect string of the server (`127.0.0.1:{port}`).
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        // The guard first, so that it can never signal a recycled PID. `Child::kill` signals
        // exactly that PID.
        if let Some(mut guard) = self.guard.take() {
            let _ = guard.kill();
            let _ = guard.wait();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `java` command line of a ZooKeeper server from Debian's jars, up to the main class
/// `main` (the caller appends the config file): small heap, quick start, admin server off,
/// log level from `ZK_TEST_LOG_LEVEL` (default `warn`).
pub(crate) fn server_command(java: &Path, main: &str) -> Command {
    let mut classpath = ZOOKEEPER_JAR.to_string();
    if Path::new(SLF4J_SIMPLE_JAR).exists() {
        classpath.push(':');
        classpath.push_str(SLF4J_SIMPLE_JAR);
    }
    let level = std::env::var("ZK_TEST_LOG_LEVEL").unwrap_or_else(|_| "warn".into());
    let mut cmd = Command::new(java);
    cmd.args([
        "-Xmx256m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Dzookeeper.admin.enableServer=false",
        "-Dzookeeper.jmx.log4j.disable=true",
        // Reap empty CONTAINER parents quickly (default: every minute).
        "-Dznode.container.checkIntervalMs=1000",
        &format!("-Dorg.slf4j.simpleLogger.defaultLogLevel={level}"),
        "-cp",
        &classpath,
        main,
    ]);
    cmd
}

/// Starts `sh` polling this test process; once it is gone, the guard kills `pid`.
pub(crate) fn orphan_guard(pid: u32) -> Option<Child> {
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 1; done; kill -9 {pid} 2>/dev/null",
        me = std::process::id()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

static SHARED: Mutex<Weak<ZkServer>> = Mutex::new(Weak::new());

/// The server shared by the tests of one binary: started by the first test that asks, killed
/// when the last one holding it finishes. `None` (after a skip message) if ZooKeeper is not
/// installed outside CI.
pub fn shared() -> Option<Arc<ZkServer>> {
    if !available() {
        return None;
    }
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(server) = slot.upgrade() {
        return Some(server);
    }
    let server = Arc::new(ZkServer::start());
    *slot = Arc::downgrade(&server);
    Some(server)
}

/// The conformance [`Factory`] over a ZooKeeper server.
#[derive(Debug, Clone)]
pub struct ZkFactory {
    server: Arc<ZkServer>,
    backend: ZooKeeperBackend,
}

impl ZkFactory {
    /// A factory over the [`shared`] server, or `None` if ZooKeeper is not installed (outside
    /// CI). The backend accepts TTLs down to the server's minimum.
    pub async fn shared() -> Option<ZkFactory> {
        let server = shared()?;
        let backend = ZooKeeperBackend::builder(server.connect_string())
            .min_ttl(MIN_SESSION_TIMEOUT)
            .connect()
            .await
            .expect("connect to the test ZooKeeper");
        Some(ZkFactory { server, backend })
    }

    /// The server under test.
    pub fn server(&self) -> &Arc<ZkServer> {
        &self.server
    }

    /// The backend under test.
    pub fn zookeeper(&self) -> &ZooKeeperBackend {
        &self.backend
    }
}

#[async_trait::async_trait]
impl Factory for ZkFactory {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn delete_as_admin(&self, key: &str) -> Result<()> {
        let client = zookeeper_client::Client::connect(&self.server.connect_string())
            .await
            .map_err(|e| fencelock::Error::backend("zookeeper", "admin connect", true, e))?;
        client
            .delete(key, None)
            .await
            .map_err(|e| fencelock::Error::backend("zookeeper", "admin delete", false, e))
    }
}
