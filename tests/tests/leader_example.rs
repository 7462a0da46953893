//! `examples/leader.rs` as an operator runs it: two instances against a real etcd or ZooKeeper.
//! ctrl-c (SIGINT) on the leader hands over to the other at once (it resigns and closes its
//! session); SIGKILL hands over after about the TTL. Run with `--nocapture` for the times.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fencelock_integration::process::ManagedChild;
use fencelock_integration::servers::{etcd, zookeeper, Cluster};
use rustix::process::Signal;

const TTL: Duration = Duration::from_secs(3);

/// The example's binary, built if missing.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("examples").join("leader");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-p", "fencelock-examples", "--example", "leader"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok && bin.exists(), "cannot build the leader example");
    }
    bin
}

/// One instance of the example, with its output lines.
struct Instance {
    child: ManagedChild,
    lines: mpsc::Receiver<(Instant, String)>,
}

impl Instance {
    fn start(flag: &str, cluster: &str, name: &str, election: &str) -> Instance {
        let mut child = Command::new(example())
            .args([flag, cluster, "--name", name, "--election", election])
            .args(["--ttl", &format!("{}s", TTL.as_secs()), "--every", "200ms"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the example");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((Instant::now(), line));
            }
        });
        let child = ManagedChild::adopt(name, child, std::path::Path::new("/dev/null"));
        Instance { child, lines }
    }

    /// Waits (bounded) for a line containing `what`; returns when it was printed.
    fn wait_for(&self, what: &str, within: Duration) -> Instant {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, line)) if line.contains(what) => return at,
                Ok(_) => {}
                Err(_) => panic!("{}: no {what:?} within {within:?}", self.child.name()),
            }
        }
    }
}

fn handovers(flag: &str, cluster: &str) {
    let election = format!("example-{}", std::process::id());
    let a = Instance::start(flag, cluster, "node-a", &election);
    a.wait_for("node-a: leading", Duration::from_secs(30));
    let b = Instance::start(flag, cluster, "node-b", &election);
    b.wait_for("campaigning", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    assert!(a.child.signal(Signal::INT));
    let led = b.wait_for("node-b: leading", Duration::from_secs(10));
    let graceful = led - sent;
    a.wait_for("node-a: stopped", Duration::from_secs(10));

    let mut c = Instance::start(flag, cluster, "node-c", &election);
    c.wait_for("campaigning", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let mut b = b;
    let killed = Instant::now();
    b.child.kill();
    let led = c.wait_for("node-c: leading", TTL * 3 + Duration::from_secs(10));
    let after_kill = led - killed;
    println!("{flag}: handover on ctrl-c {graceful:?}; on SIGKILL {after_kill:?} (TTL {TTL:?})");
    assert!(
        graceful < Duration::from_secs(1),
        "ctrl-c handover took {graceful:?}"
    );
    assert!(
        after_kill <= TTL + Duration::from_secs(3),
        "kill handover took {after_kill:?}"
    );
    c.child.kill();
}

#[test]
fn etcd_instances_hand_over() {
    let Some(cluster) = etcd::shared() else {
        return;
    };
    handovers("--etcd", &cluster.endpoint(0));
}

#[test]
fn zookeeper_instances_hand_over() {
    let Some(cluster) = zookeeper::shared() else {
        return;
    };
    handovers("--zookeeper", &cluster.connect_string());
}
