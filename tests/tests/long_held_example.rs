//! `examples/long_held.rs` against a real etcd and ZooKeeper: a lock held past the threshold is
//! reported once, with its holder's session and token; with `--revoke` the holder's
//! `revoke_requested()` resolves; once released, the alert is resolved.

use std::time::Duration;

use fencelock::Session;
use fencelock_integration::example::Program;
use fencelock_integration::servers::{etcd, zookeeper, Cluster};
use fencelock_integration::target::{Kind, Target};

const WITHIN: Duration = Duration::from_secs(30);

async fn alerts_and_revokes(t: Target, flag: &str) {
    let ns = fencelock::conformance::unique_namespace("long_held");
    let s: Session = t.session(&ns, Duration::from_secs(10)).await;
    let guard = s.mutex("jobs/reindex").unwrap().lock().await.unwrap();
    let asked = guard.revoke_requested();
    let check = Program::start(
        "long_held",
        "long_held",
        &[
            flag,
            &t.endpoint,
            "--namespace",
            &ns,
            "--lock",
            "jobs/reindex",
            "--lock",
            "jobs/free",
            "--threshold",
            "1s",
            "--every",
            "200ms",
            "--revoke",
        ],
    );
    let (_, alert) =
        tokio::task::block_in_place(|| check.wait_for_line("ALERT jobs/reindex", WITHIN));
    assert!(alert.contains(&format!("session {}", s.id())), "{alert}");
    assert!(
        alert.contains(&format!("token {}", guard.token())),
        "{alert}"
    );
    tokio::time::timeout(WITHIN, asked)
        .await
        .expect("the check's revocation request reached the holder");
    assert!(guard.is_held(), "a request, not a release");
    guard.release().await.unwrap();
    tokio::task::block_in_place(|| check.wait_for("RESOLVED jobs/reindex", WITHIN));
    s.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_long_held_lock_is_reported() {
    let Some(cluster) = etcd::shared() else {
        return;
    };
    alerts_and_revokes(Target::new(Kind::Etcd, cluster.endpoint(0)), "--etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_long_held_lock_is_reported() {
    let Some(cluster) = zookeeper::shared() else {
        return;
    };
    alerts_and_revokes(
        Target::new(Kind::ZooKeeper, cluster.connect_string()),
        "--zookeeper",
    )
    .await;
}
