//! The adversity suite on a 3-member etcd cluster: every scenario, its history checked, a
//! summary line printed per scenario (run with `--nocapture` to see the table).

use fencelock_integration::adversity::{run_all, RunConfig};
use fencelock_integration::servers::available;
use fencelock_integration::servers::etcd::EtcdCluster;
use fencelock_integration::target::Kind;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_etcd_cluster() {
    if !available(Kind::Etcd) {
        return;
    }
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(3))
        .await
        .unwrap();
    let cfg = RunConfig::ci(env!("CARGO_BIN_EXE_holder"));
    run_all("etcd (3 members)", &cluster, &cfg).await;
}
