//! Faults with a real ZooKeeper server: a leader killed in another process (SIGKILL), a
//! leader and a lock holder cut off by a proxy past their session timeout.

use std::time::Duration;

use fencelock_integration::faults::{self, Kind, Target};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leader_is_replaced() {
    let Some((_f, t)) = target().await else {
        return;
    };
    faults::killed_leader_is_replaced(env!("CARGO_BIN_EXE_holder"), &t, TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_leader_steps_down_first() {
    let Some((_f, t)) = target().await else {
        return;
    };
    faults::cut_off_leader_steps_down_first(&t, TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_holder_is_fenced() {
    let Some((_f, t)) = target().await else {
        return;
    };
    faults::cut_off_holder_is_fenced(&t, TTL).await;
}
