//! Faults with a real ZooKeeper server: a leader killed in another process (SIGKILL), a
//! leader and a lock holder cut off by a proxy past their session timeout.

use std::time::Duration;

use fencelock_integration::faults::{Kind, Target};
use fencelock_integration::zookeeper::ZkFactory;

const TTL: Duration = Duration::from_secs(2);

async fn target() -> Option<(ZkFactory, Target)> {
    let f = ZkFactory::shared().await?;
    let t = Target {
        kind: Kind::ZooKeeper,
        endpoint: f.server().connect_string(),
    };
    Some((f, t))
}

fencelock_integration::fault_tests!(target(), TTL, env!("CARGO_BIN_EXE_holder"));
