//! The adversity suite on 3-member etcd clusters: every scenario, its history checked, a
//! summary line printed per scenario (run with `--nocapture` to see the tables). The crash and
//! the gray scenarios run side by side, each part on its own cluster.

use fencelock_integration::adversity::{run_all, Part, RunConfig};
use fencelock_integration::servers::available;
use fencelock_integration::servers::etcd::EtcdCluster;
use fencelock_integration::target::Kind;

async fn suite(label: &str, part: Part) {
    if !available(Kind::Etcd) {
        return;
    }
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(3))
        .await
        .unwrap();
    let cfg = RunConfig::ci(env!("CARGO_BIN_EXE_holder"));
    run_all(label, &cluster, &cfg, part).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_etcd_cluster() {
    suite("etcd (3 members)", Part::Crash).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_etcd_cluster_gray() {
    suite("etcd (3 members), gray failures", Part::Gray).await;
}
