//! Faults with a real etcd member: a leader killed in another process (SIGKILL), a leader and a
//! lock holder cut off by a proxy past their TTL.

use std::time::Duration;

use fencelock_integration::servers::etcd::EtcdFactory;
use fencelock_integration::servers::Cluster;
use fencelock_integration::target::Target;

async fn target() -> Option<(EtcdFactory, Target)> {
    let f = EtcdFactory::shared().await?;
    let t = f.cluster.target();
    Some((f, t))
}

fencelock_integration::fault_tests!(
    target(),
    Duration::from_secs(2),
    env!("CARGO_BIN_EXE_holder")
);
