//! The adversity suite on a 3-server ZooKeeper ensemble: every scenario, its history checked,
//! a summary line printed per scenario (run with `--nocapture` to see the table).

use std::time::Duration;

use fencelock_integration::adversity::{run_all, RunConfig};
use fencelock_integration::servers::available;
use fencelock_integration::servers::zookeeper::ZkEnsemble;
use fencelock_integration::target::Kind;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_zookeeper_ensemble() {
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
    run_all("ZooKeeper (3 servers)", &ensemble, &cfg).await;
}
