//! `examples/leader.rs` as an operator runs it: two instances against a real etcd or ZooKeeper.
//! ctrl-c (SIGINT) on the leader hands over to the other at once (it resigns and closes its
//! session); SIGKILL hands over after about the TTL. Run with `--nocapture` for the times.

use std::time::{Duration, Instant};

use fencelock_integration::example::Program;
use fencelock_integration::servers::{etcd, zookeeper, Cluster};
use rustix::process::Signal;

const TTL: Duration = Duration::from_secs(3);

/// One instance of the example.
fn instance(flag: &str, cluster: &str, name: &str, election: &str) -> Program {
    let ttl = format!("{}s", TTL.as_secs());
    Program::start(
        "leader",
        name,
        &[
            flag,
            cluster,
            "--name",
            name,
            "--election",
            election,
            "--ttl",
            &ttl,
            "--every",
            "200ms",
        ],
    )
}

fn handovers(flag: &str, cluster: &str) {
    let election = format!("example-{}", std::process::id());
    let a = instance(flag, cluster, "node-a", &election);
    a.wait_for("node-a: leading", Duration::from_secs(30));
    let b = instance(flag, cluster, "node-b", &election);
    b.wait_for("campaigning", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    assert!(a.child.signal(Signal::INT));
    let led = b.wait_for("node-b: leading", Duration::from_secs(10));
    let graceful = led - sent;
    a.wait_for("node-a: stopped", Duration::from_secs(10));

    let mut c = instance(flag, cluster, "node-c", &election);
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
