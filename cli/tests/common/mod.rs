//! What the end-to-end tests of the `fencelock` binary share: the clusters to run it against
//! and a running `fencelock` process.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::conformance::{unique_namespace, Factory};
use fencelock::Session;
use fencelock_integration::process::ManagedChild;
use fencelock_integration::servers::etcd::EtcdFactory;
use fencelock_integration::servers::redis::RedisFactory;
use fencelock_integration::servers::zookeeper::ZkFactory;
use fencelock_integration::servers::Cluster;

pub const WITHIN: Duration = Duration::from_secs(30);

/// One cluster to run the binary against.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    pub factory: Arc<dyn Factory>,
}

impl Target {
    pub async fn etcd() -> Option<Target> {
        let f = EtcdFactory::shared().await?;
        Some(Target {
            url: format!("etcd://{}", f.cluster.endpoint(0)),
            factory: Arc::new(f),
        })
    }

    pub async fn zookeeper() -> Option<Target> {
        let f = ZkFactory::shared().await?;
        Some(Target {
            url: format!("zk://{}", f.server().connect_string()),
            factory: Arc::new(f),
        })
    }

    pub async fn redis() -> Option<Target> {
        let f = RedisFactory::shared().await?;
        Some(Target {
            url: format!("redis://{}", f.server.addr()),
            factory: Arc::new(f),
        })
    }

    /// A library session in `ns`, to hold or inspect what the binary does.
    pub async fn session(&self, ns: &str) -> Session {
        Session::builder(self.factory.backend())
            .namespace(ns)
            .start()
            .await
            .unwrap()
    }
}

/// A `fencelock` process, its output in `dir/{label}.log`.
pub struct Run {
    pub child: ManagedChild,
    pub log: PathBuf,
}

pub fn command(url: &str, ns: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    cmd.env("FENCELOCK_ENDPOINTS", url)
        .env("FENCELOCK_NAMESPACE", ns)
        .env("FENCELOCK_TTL", "3s");
    cmd
}

impl Run {
    pub fn start(url: &str, ns: &str, dir: &Path, label: &str, args: &[&str]) -> Run {
        let mut cmd = command(url, ns);
        cmd.args(args);
        Run::spawn(cmd, dir, label)
    }

    /// Starts `cmd` (a [`command`] with its arguments) in `dir`.
    pub fn spawn(mut cmd: Command, dir: &Path, label: &str) -> Run {
        let log = dir.join(format!("{label}.log"));
        cmd.current_dir(dir);
        let child = ManagedChild::spawn(label, cmd, &log).expect("start fencelock");
        Run { child, log }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) for the process to exit.
    pub async fn exit(&mut self, within: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait() {
                return s;
            }
            assert!(
                start.elapsed() < within,
                "{} did not exit within {within:?}; output:\n{}",
                self.child.name(),
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The exit status as a shell reports it: the code, or 128 + N if signal N ended the
    /// process (fencelock ends by the signal that stopped it, or its command).
    pub async fn code(&mut self, within: Duration) -> i32 {
        shell_status(self.exit(within).await)
    }
}

/// Runs `fencelock args…` to its end (bounded); returns its exit code and output.
pub async fn run(url: &str, ns: &str, dir: &Path, args: &[&str]) -> (i32, String) {
    let label = format!("run-{}", uuid());
    let mut r = Run::start(url, ns, dir, &label, args);
    let code = r.code(WITHIN).await;
    (code, r.output())
}

pub fn uuid() -> String {
    unique_namespace("x")
        .rsplit('-')
        .next()
        .unwrap()
        .to_string()
}

/// Waits (bounded) until the file at `path` contains `needle`; returns its content.
pub async fn file_contains(path: &Path, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let s = std::fs::read_to_string(path).unwrap_or_default();
        if s.contains(needle) {
            return s;
        }
        assert!(
            start.elapsed() < WITHIN,
            "{} never contained {needle:?}: {s:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The size of the file at `path` (0 if there is none).
pub fn size_of(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Waits (bounded) until the file at `path` grows past `before` bytes: the command writing it
/// goes on. `context` (the run's output, say) is shown if it does not.
pub async fn grows_past(path: &Path, before: u64, context: impl Fn() -> String) {
    let start = Instant::now();
    while size_of(path) == before {
        assert!(
            start.elapsed() < WITHIN,
            "{} stayed at {before} bytes: the command did not go on: {}",
            path.display(),
            context()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the process `pid` still runs (a zombie does not).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// The PID written to the file at `path` (waits for it, bounded).
pub async fn pid_in(path: &Path) -> i32 {
    file_contains(path, "\n")
        .await
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `status` as a shell reports it: the exit code, or 128 + N for a death by signal N.
pub fn shell_status(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or(status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Runs each named `async fn(Target)` as a test on etcd, ZooKeeper and Redis (a module per
/// server; the test returns at once where the server is not available outside CI).
macro_rules! on_each {
    ($($name:ident),* $(,)?) => {
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(t) = super::Target::etcd().await else { return };
                    super::$name(t).await;
                }
            )*
        }
        mod zookeeper {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(t) = super::Target::zookeeper().await else { return };
                    super::$name(t).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(t) = super::Target::redis().await else { return };
                    super::$name(t).await;
                }
            )*
        }
    };
}
