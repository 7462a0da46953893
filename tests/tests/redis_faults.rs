//! Faults with a real Redis server: a leader killed in another process (SIGKILL), a leader and
//! a lock holder cut off by a proxy past their TTL, a holder paused (SIGSTOP) past its TTL whose
//! guarded write Redis refuses.

use std::sync::Arc;
use std::time::Duration;

use fencelock_integration::servers::redis::{self, RedisServer};
use fencelock_integration::target::{Kind, Target};

async fn target() -> Option<(Arc<RedisServer>, Target)> {
    let s = redis::shared()?;
    let t = Target::new(Kind::Redis, s.addr());
    Some((s, t))
}

fencelock_integration::fault_tests!(
    target(),
    Duration::from_secs(2),
    env!("CARGO_BIN_EXE_holder")
);
