//! A leader-elected service on the in-memory backend: it campaigns, stamps every write with its
//! epoch, and steps down the moment `lost()` fires.
//!
//! Two nodes run in this process. node-a leads first; then its session ends (as when its
//! process dies), node-b takes over with a larger epoch, and the storage refuses node-a's late
//! write.
//!
//! Run: `cargo run --example leader`

use std::sync::Arc;
use std::time::Duration;

use fencelock::{Error, Fence, Leadership, MemoryBackend, Session};

/// Downstream storage: refuses writes stamped with an older epoch than it has seen.
#[derive(Default)]
struct Storage {
    fence: Fence,
}

/// The work a leader does: a write per tick, stamped with the epoch, until leadership is lost.
async fn lead(
    node: &str,
    leader: &Leadership,
    storage: &Storage,
    ticks: usize,
) -> Result<(), Error> {
    let epoch = leader.epoch();
    let lost = leader.lost();
    tokio::pin!(lost);
    for i in 0..ticks {
        tokio::select! {
            reason = &mut lost => {
                println!("{node}: leadership lost ({reason}): stepping down");
                return Ok(());
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                storage.fence.admit(epoch)?;
                println!("{node}: write #{i} accepted with epoch {epoch}");
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let backend = MemoryBackend::new(); // or EtcdBackend / ZooKeeperBackend
    let storage = Arc::new(Storage::default());
    let ttl = Duration::from_secs(2);
    let a = Session::builder(backend.clone()).ttl(ttl).start().await?;
    let b = Session::builder(backend).ttl(ttl).start().await?;

    let leader_a = a
        .election("orders-primary")?
        .campaign(b"node-a:8080")
        .await?;
    println!("node-a: leading with epoch {}", leader_a.epoch());

    // node-b campaigns and waits; it observes the election meanwhile.
    let node_b = tokio::spawn({
        let storage = storage.clone();
        async move {
            let election = b.election("orders-primary")?;
            let leader = election.campaign(b"node-b:8080").await?;
            let info = election.leader().await?.expect("a leader");
            println!(
                "node-b: leading with epoch {} (published value {:?})",
                leader.epoch(),
                String::from_utf8_lossy(&info.value)
            );
            lead("node-b", &leader, &storage, 3).await?;
            leader.resign().await?;
            println!("node-b: resigned");
            Ok::<_, Error>(())
        }
    });

    lead("node-a", &leader_a, &storage, 3).await?;
    println!("node-a: its session ends");
    a.close().await?;
    lead("node-a", &leader_a, &storage, usize::MAX).await?;
    let stale = leader_a.epoch();

    node_b.await.expect("node-b task")?;
    match storage.fence.admit(stale) {
        Err(e) => println!("storage: refused node-a's late write: {e}"),
        Ok(()) => panic!("a deposed leader's write must be refused"),
    }
    Ok(())
}
