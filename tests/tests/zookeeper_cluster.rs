//! The adversity suite on a 3-server ZooKeeper ensemble: every scenario, its history checked,
//! a summary line printed per scenario (run with `--nocapture` to see the table).

use fencelock_integration::scenarios::{run_all, RunConfig};
use fencelock_integration::zk_cluster::ZkEnsemble;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_zookeeper_ensemble() {
    if !fencelock_integration::zookeeper::available() {
        return;
    }
    let mut ensemble = ZkEnsemble::start();
    let cfg = RunConfig::ci(env!("CARGO_BIN_EXE_holder"));
    run_all("ZooKeeper (3 servers)", &mut ensemble, &cfg).await;
}
