//! Apache Curator from Java, for the interoperability tests and the benchmark: the Java
//! programs of `tests/java/` compiled with `javac` into a temporary directory at run time (no
//! build system), against the jars of Debian's `libcurator-recipes-java` in `/usr/share/java`.
//!
//! ```ignore
//! if !fencelock_integration::curator::available() { return } // skipped (a failure in CI)
//! let classes = tokio::task::spawn_blocking(curator::programs).await?;
//! let mut java = CuratorProgram::mutex(&classes, &server.connect_string(), "/ns/lock", ..);
//! let (czxid, node) = java.acquired(WAIT).await;
//! java.release().await;
//! ```

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::in_ci;
use crate::process::ManagedChild;

/// The jars Curator's `InterProcessMutex` needs on the class path (the Class-Path entries of
/// the Curator jars' manifests, minus the ones the client side never loads).
pub const JARS: &[&str] = &[
    "/usr/share/java/curator-recipes.jar",
    "/usr/share/java/curator-framework.jar",
    "/usr/share/java/curator-client.jar",
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/zookeeper-jute.jar",
    "/usr/share/java/guava.jar",
    "/usr/share/java/slf4j-api.jar",
];

/// Silences slf4j (it warns about a missing binding otherwise); optional.
const SLF4J_NOP_JAR: &str = "/usr/share/java/slf4j-nop.jar";

/// Where the Java sources live (`tests/java/`).
pub fn sources_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("java")
}

/// `bin/{name}` of `JAVA_HOME`, else `{name}` on `PATH`.
fn jdk_tool(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("JAVA_HOME").map(|h| PathBuf::from(h).join("bin").join(name));
    let path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    home.into_iter().chain(path).find(|p| p.is_file())
}

/// What is missing to run the Curator programs (`java`, `javac`, the jars), if anything.
pub fn missing() -> Vec<String> {
    let mut out: Vec<String> = ["java", "javac"]
        .into_iter()
        .filter(|t| jdk_tool(t).is_none())
        .map(String::from)
        .collect();
    out.extend(
        JARS.iter()
            .filter(|j| !Path::new(j).exists())
            .map(|j| j.to_string()),
    );
    out
}

/// Whether `java`, `javac` and the Curator jars are installed.
pub fn installed() -> bool {
    missing().is_empty()
}

/// Whether the Curator programs can run: `true` if everything is installed. Otherwise panics
/// when `CI=true` (in CI a missing piece is a failure), else prints a skip message and
/// returns `false`.
pub fn available() -> bool {
    let missing = missing();
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "Apache Curator from Java is not available (Debian packages `libcurator-recipes-java` \
         and a JDK with javac); missing: {}",
        missing.join(", ")
    );
    if in_ci() {
        panic!("{msg}: required in CI");
    }
    eprintln!("skipped: {msg}");
    false
}

/// The class path of the Curator jars (plus slf4j-nop when present).
pub fn jar_classpath() -> String {
    let mut jars: Vec<&str> = JARS.to_vec();
    if Path::new(SLF4J_NOP_JAR).exists() {
        jars.push(SLF4J_NOP_JAR);
    }
    jars.join(":")
}

/// The Java programs of `tests/java/`, compiled into a temporary directory (removed on drop).
#[derive(Debug)]
pub struct JavaClasses {
    dir: tempfile::TempDir,
}

impl JavaClasses {
    /// Compiles every `.java` file of `tests/java/`. Blocking (a second or two).
    pub fn compile() -> Result<JavaClasses, String> {
        let javac = jdk_tool("javac").ok_or("javac not found")?;
        let dir = tempfile::Builder::new()
            .prefix("fencelock-java-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let mut sources: Vec<PathBuf> = std::fs::read_dir(sources_dir())
            .map_err(|e| format!("{}: {e}", sources_dir().display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "java"))
            .collect();
        sources.sort();
        let out = std::process::Command::new(javac)
            .arg("-nowarn")
            .arg("-d")
            .arg(dir.path())
            .arg("-cp")
            .arg(jar_classpath())
            .args(&sources)
            .output()
            .map_err(|e| format!("run javac: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "javac failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(JavaClasses { dir })
    }

    /// The class path to run the programs: the compiled classes and the Curator jars.
    pub fn classpath(&self) -> String {
        format!("{}:{}", self.dir.path().display(), jar_classpath())
    }

    /// A `java` command running `main_class` with the class path set and `args`.
    pub fn command(&self, main_class: &str) -> Command {
        let java = jdk_tool("java").unwrap_or_else(|| PathBuf::from("java"));
        let mut cmd = Command::new(java);
        cmd.args(["-Xmx128m", "-XX:+UseSerialGC", "-cp"])
            .arg(self.classpath())
            .arg(main_class);
        cmd
    }
}

static SHARED: Mutex<Weak<JavaClasses>> = Mutex::new(Weak::new());

/// The shared ZooKeeper server and the compiled Curator programs, for an interop test; `None`
/// (the test skips, with a message) if either is missing outside CI.
pub async fn with_zookeeper() -> Option<(crate::servers::zookeeper::ZkFactory, Arc<JavaClasses>)> {
    let f = crate::servers::zookeeper::ZkFactory::shared().await?;
    if !available() {
        return None;
    }
    let classes = tokio::task::spawn_blocking(programs)
        .await
        .expect("compile the Java programs");
    Some((f, classes))
}

/// The compiled programs shared by the tests of one binary (compiled by the first that asks;
/// blocking). Panics if `javac` fails: call [`available`] first.
pub fn programs() -> Arc<JavaClasses> {
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = slot.upgrade() {
        return c;
    }
    let classes = Arc::new(JavaClasses::compile().unwrap_or_else(|e| panic!("{e}")));
    *slot = Arc::downgrade(&classes);
    classes
}

/// A running Curator program of `tests/java/`, in a JVM of its own: `CuratorMutex` (Curator's
/// `InterProcessMutex` on one lock path), `CuratorLatch` (a `LeaderLatch` on one election
/// path), `CuratorLock` (the other lock recipes) or `CuratorGray` (contending mutex loops, for
/// the gray-failure benchmark). Killed (by its PID) on drop.
#[derive(Debug)]
pub struct CuratorProgram {
    name: &'static str,
    child: ManagedChild,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    /// Everything the program printed so far (stdout and stderr), for failure messages.
    log: Arc<Mutex<Vec<String>>>,
}

impl CuratorProgram {
    /// Starts `CuratorMutex`: it connects to `connect`, prints `STARTED`, then acquires the
    /// mutex on `path`, waiting at most `wait` (then prints `TIMEOUT` and exits), and once
    /// granted holds it until [`release`](Self::release) or for at most `hold`.
    pub fn mutex(
        classes: &JavaClasses,
        connect: &str,
        path: &str,
        wait: Duration,
        hold: Duration,
    ) -> CuratorProgram {
        let secs = |d: Duration| d.as_secs().max(1).to_string();
        let args = [
            connect,
            path,
            "--wait-secs",
            &secs(wait),
            "--hold-secs",
            &secs(hold),
        ];
        Self::start(classes, "CuratorMutex", &args)
    }

    /// Starts `CuratorLatch`: it connects to `connect`, joins the `LeaderLatch` on `path` as
    /// participant `id`, prints `STARTED <node>`, waits at most `wait` to lead (then `TIMEOUT`),
    /// prints `LEADER <czxid> <node>` and leads until [`close`](Self::close).
    pub fn latch(
        classes: &JavaClasses,
        connect: &str,
        path: &str,
        id: &str,
        wait: Duration,
    ) -> CuratorProgram {
        let secs = wait.as_secs().max(1).to_string();
        Self::start(
            classes,
            "CuratorLatch",
            &[connect, path, id, "--wait-secs", &secs],
        )
    }

    /// Starts `CuratorLock` with `recipe` (`read`, `write`, `semaphore:N`, `revocable`,
    /// `revoke:<node>`): like [`mutex`](Self::mutex), but with Curator's
    /// `InterProcessReadWriteLock`, `InterProcessSemaphoreV2`, a revocable `InterProcessMutex`
    /// (it prints `REVOKE_REQUESTED` and releases when asked to), or a `Revoker` request on a
    /// node (it prints `REVOKE_SENT` and exits).
    pub fn recipe(
        classes: &JavaClasses,
        connect: &str,
        path: &str,
        recipe: &str,
        wait: Duration,
        hold: Duration,
    ) -> CuratorProgram {
        let secs = |d: Duration| d.as_secs().max(1).to_string();
        let args = [
            connect,
            path,
            recipe,
            "--wait-secs",
            &secs(wait),
            "--hold-secs",
            &secs(hold),
        ];
        Self::start(classes, "CuratorLock", &args)
    }

    /// Starts `CuratorGray` (the gray-failure benchmark, `bench/src/gray.rs`): `sessions`
    /// Curator clients on `connect` (session timeout `session`, connection timeout
    /// `connection`) that, once told `START`, loop `InterProcessMutex` acquire + release on
    /// `path`; the first (measured) one also sends `checkExists("/")` every `beat`. It prints
    /// `SESSION <hex id>` first; see the program for the rest of its protocol.
    pub fn gray(
        classes: &JavaClasses,
        connect: &str,
        path: &str,
        sessions: usize,
        session: Duration,
        connection: Duration,
        beat: Duration,
    ) -> CuratorProgram {
        let ms = |d: Duration| d.as_millis().max(1).to_string();
        let args = [
            connect,
            path,
            &sessions.to_string(),
            &ms(session),
            &ms(connection),
            &ms(beat),
        ];
        Self::start(classes, "CuratorGray", &args)
    }

    fn start(classes: &JavaClasses, name: &'static str, args: &[&str]) -> CuratorProgram {
        let mut child = classes
            .command(name)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start java");
        let (tx, lines) = mpsc::unbounded_channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let stdin = child.stdin.take();
        let (log1, log2) = (log.clone(), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                log1.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log2.lock().unwrap().push(format!("stderr: {line}"));
            }
        });
        let child = ManagedChild::adopt(name, child, Path::new("/dev/null"));
        CuratorProgram {
            name,
            stdin,
            child,
            lines,
            log,
        }
    }

    /// What the program printed so far.
    pub fn output(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The next line the program prints, or `None` if it prints none within `within` (or
    /// ended).
    pub async fn next_line(&mut self, within: Duration) -> Option<String> {
        tokio::time::timeout(within, self.lines.recv())
            .await
            .ok()
            .flatten()
    }

    /// Waits (bounded) for the next line and checks that it starts with `prefix`; returns
    /// the rest of it. Panics with the program's output otherwise.
    pub async fn expect(&mut self, prefix: &str, within: Duration) -> String {
        match self.next_line(within).await {
            Some(line) if line.starts_with(prefix) => line[prefix.len()..].trim().to_string(),
            Some(line) => panic!(
                "{} said {line:?}, expected {prefix:?}; output:\n{}",
                self.name,
                self.output()
            ),
            None => panic!(
                "{} did not say {prefix:?} within {within:?}; output:\n{}",
                self.name,
                self.output()
            ),
        }
    }

    /// Waits (bounded) for `ACQUIRED <czxid> <node>`; returns the czxid and the node path.
    pub async fn acquired(&mut self, within: Duration) -> (u64, String) {
        let rest = self.expect("ACQUIRED ", within).await;
        let (czxid, node) = rest.split_once(' ').expect("ACQUIRED <czxid> <node>");
        (czxid.parse().expect("czxid"), node.to_string())
    }

    /// Waits (bounded) for `LEADER <czxid> <node>`; returns the czxid and the node path.
    pub async fn leading(&mut self, within: Duration) -> (u64, String) {
        let rest = self.expect("LEADER ", within).await;
        let (czxid, node) = rest.split_once(' ').expect("LEADER <czxid> <node>");
        (czxid.parse().expect("czxid"), node.to_string())
    }

    fn say(&mut self, line: &str) {
        self.tell(line).expect("write stdin");
    }

    /// Writes `line` (and a newline) to the program's stdin; an error if it is closed (the
    /// program ended).
    pub fn tell(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| std::io::Error::other("stdin closed"))?;
        stdin.write_all(line.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush()
    }

    /// The program's exit status if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait()
    }

    /// Asks `CuratorMutex` to release (a line on its stdin) and waits (bounded) until it says
    /// `RELEASED`.
    pub async fn release(&mut self, within: Duration) {
        self.say("release");
        self.expect("RELEASED", within).await;
    }

    /// Asks `CuratorLatch` to close its latch and waits (bounded) until it says `CLOSED`.
    pub async fn close(&mut self, within: Duration) {
        self.say("close");
        self.expect("CLOSED", within).await;
    }

    /// Waits (bounded) for the program to exit; returns its status.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait() {
                return status;
            }
            assert!(
                start.elapsed() < within,
                "{} did not exit within {within:?}; output:\n{}",
                self.name,
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The program's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.pid()
    }
}

/// What a Curator benchmark run measured.
#[derive(Debug, Clone, Copy)]
pub struct CuratorRate {
    /// Acquisitions per second while counting.
    pub rate: f64,
    /// Acquisitions in all, the warm-up included.
    pub total: u64,
}

/// Runs `tests/java/CuratorBench.java`: `sessions` Curator clients (one connection each) loop
/// `InterProcessMutex` acquire + release on `path` for `seconds` after a short JIT warm-up;
/// returns the acquisitions per second it measured.
pub async fn bench_rate(
    classes: &JavaClasses,
    connect: &str,
    path: &str,
    sessions: usize,
    seconds: f64,
) -> Result<f64, String> {
    Ok(
        bench_recipe(classes, connect, path, sessions, seconds, "mutex")
            .await?
            .rate,
    )
}

/// Like [`bench_rate`], with `recipe`: `mutex`, `rw` (`InterProcessReadWriteLock`, nine reads
/// per write) or `semaphore:N` (`InterProcessSemaphoreV2`).
pub async fn bench_recipe(
    classes: &JavaClasses,
    connect: &str,
    path: &str,
    sessions: usize,
    seconds: f64,
    recipe: &str,
) -> Result<CuratorRate, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let log = dir.path().join("bench.log");
    let mut cmd = classes.command("CuratorBench");
    cmd.args([
        connect,
        path,
        &sessions.to_string(),
        &seconds.to_string(),
        recipe,
    ]);
    let mut child = ManagedChild::spawn("CuratorBench", cmd, &log)
        .map_err(|e| format!("run CuratorBench: {e}"))?;
    let limit = Duration::from_secs_f64(seconds * 2.0) + Duration::from_secs(120);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait() {
            break status;
        }
        if start.elapsed() > limit {
            return Err(format!("CuratorBench did not finish within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let field = |tag: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(tag))
            .and_then(|r| r.split_whitespace().next().map(str::to_string))
    };
    let rate = field("RATE ").and_then(|r| r.parse().ok());
    let total = field("TOTAL ").and_then(|r| r.parse().ok());
    match (rate, total) {
        (Some(rate), Some(total)) => Ok(CuratorRate { rate, total }),
        _ => Err(format!("CuratorBench ({status}): {out}")),
    }
}

/// `_c_{uuid}-{marker}{10 digits}` under `parent`.
pub fn assert_curator_name(key: &str, parent: &str, marker: &str) {
    let name = key
        .strip_prefix(&format!("{parent}/"))
        .unwrap_or_else(|| panic!("{key} is not a child of {parent}"));
    let rest = name.strip_prefix("_c_").expect("protected prefix _c_");
    let (uuid, seq) = rest.split_at(36);
    assert!(
        uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') && uuid.matches('-').count() == 4,
        "uuid part of {name}"
    );
    let seq = seq.strip_prefix(&format!("-{marker}")).expect("marker");
    assert!(
        seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()),
        "sequence of {name}"
    );
}
