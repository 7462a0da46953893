//! The adversity suite on a 3-member etcd cluster: every scenario, its history checked, a
//! summary line printed per scenario (run with `--nocapture` to see the table).

use fencelock_integration::cluster::EtcdCluster;
use fencelock_integration::scenarios::{run_all, RunConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_etcd_cluster() {
    if !fencelock_integration::etcd::available() {
        return;
    }
    let mut cluster = EtcdCluster::start();
    let cfg = RunConfig::ci(env!("CARGO_BIN_EXE_holder"));
    run_all("etcd (3 members)", &mut cluster, &cfg).await;
}
