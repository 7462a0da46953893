//! The adversity suite on 3-server ZooKeeper ensembles: every scenario, its history checked,
//! a summary line printed per scenario (run with `--nocapture` to see the tables). The crash
//! and the gray scenarios run side by side, each part on its own ensemble.

use std::time::Duration;

use fencelock_integration::adversity::{run_all, Part, RunConfig};
use fencelock_integration::servers::available;
use fencelock_integration::servers::zookeeper::ZkEnsemble;
use fencelock_integration::target::Kind;

async fn suite(label: &str, part: Part) {
    if !available(Kind::ZooKeeper) {
        return;
    }
    let ensemble = tokio::task::spawn_blocking(|| ZkEnsemble::start(3))
        .await
        .unwrap();
    let cfg = RunConfig {
        // The short TTL of the gray scenarios on ZooKeeper: 4 s.
        gray_ttls: vec![Duration::from_secs(4), Duration::from_secs(10)],
        ..RunConfig::ci(env!("CARGO_BIN_EXE_holder"))
    };
    run_all(label, &ensemble, &cfg, part).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_zookeeper_ensemble() {
    suite("ZooKeeper (3 servers)", Part::Crash).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_zookeeper_ensemble_gray() {
    suite("ZooKeeper (3 servers), gray failures", Part::Gray).await;
}
