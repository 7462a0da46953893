//! Faults with a real ZooKeeper server: a leader killed in another process (SIGKILL), a leader
//! and a lock holder cut off by a proxy past their session timeout.

use std::time::Duration;

use fencelock_integration::servers::zookeeper::ZkFactory;
use fencelock_integration::servers::Cluster;
use fencelock_integration::target::Target;

async fn target() -> Option<(ZkFactory, Target)> {
    let f = ZkFactory::shared().await?;
    let t = f.server().target();
    Some((f, t))
}

fencelock_integration::fault_tests!(
    target(),
    Duration::from_secs(2),
    env!("CARGO_BIN_EXE_holder")
);
