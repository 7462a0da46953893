//! The handoff limit of a server: two raw clients passing one lock back and forth with the
//! least a queue lock needs per handoff — the holder's delete commits, the one waiter gets one
//! watch event, reads the queue once and holds. No library code of ours is involved, so the
//! rate it reaches is what any queue lock on that server can approach with two contenders.
//!
//! Each player loops: delete its entry, queue a new one (etcd: a key under the lease, ZooKeeper:
//! an ephemeral-sequential node), read whether an entry is ahead, and if so watch it, check it
//! once more (a deletion before the watch is seen by that read), wait for its deletion and read
//! again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, GetOptions, PutOptions, SortOrder, SortTarget};
use zookeeper_client as zk;

const ETCD_PREFIX: &str = "bench/pingpong/";
const ZK_PARENT: &str = "/bench-pingpong";

/// The etcd handoff limit: handoffs per second between two raw etcd-client connections.
pub async fn etcd(endpoint: &str, seconds: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let mut players = Vec::new();
    for name in ["a", "b"] {
        let mut c = Client::connect([endpoint], None)
            .await
            .expect("etcd client");
        let lease = c.lease_grant(60, None).await.expect("lease").id();
        let (stop, grants) = (stop.clone(), grants.clone());
        let key = format!("{ETCD_PREFIX}{name}");
        // One watch stream per player, opened on a key nobody writes.
        let mut stream = c
            .watch(format!("bench/pingpong-idle/{name}"), None)
            .await
            .expect("watch stream");
        // Its own "created" reply, so that the first one a wait reads is the wait's.
        stream.message().await.expect("watch").expect("stream");
        players.push(async move {
            while !stop.load(Ordering::Relaxed) {
                c.delete(key.as_str(), None).await.expect("delete");
                let rev = c
                    .put(key.as_str(), "", Some(PutOptions::new().with_lease(lease)))
                    .await
                    .expect("put")
                    .header()
                    .expect("header")
                    .revision();
                let ahead = |c: &mut Client| {
                    let mut c = c.clone();
                    async move {
                        let opts = GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_max_create_revision(rev - 1)
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_limit(1);
                        let resp = c.get(ETCD_PREFIX, Some(opts)).await.expect("read");
                        resp.kvs().first().map(|kv| kv.key().to_vec())
                    }
                };
                if let Some(other) = ahead(&mut c).await {
                    // A watch from now on the one watch stream (a watch from a past revision
                    // waits for etcd's catch-up loop, up to 100 ms), then a read: a deletion
                    // between the two is seen by one or the other.
                    stream.watch(other, None).await.expect("watch");
                    let mut id = None;
                    let mut checked = false;
                    loop {
                        let resp = stream.message().await.expect("watch").expect("stream");
                        if resp.created() && id.is_none() {
                            id = Some(resp.watch_id());
                        }
                        if id.is_some() && !checked {
                            checked = true;
                            if ahead(&mut c).await.is_none() {
                                break;
                            }
                        }
                        let deleted = Some(resp.watch_id()) == id
                            && resp
                                .events()
                                .iter()
                                .any(|e| e.event_type() == EventType::Delete);
                        if deleted {
                            ahead(&mut c).await;
                            break;
                        }
                    }
                    if let Some(id) = id {
                        stream.cancel(id).await.expect("cancel");
                    }
                }
                grants.fetch_add(1, Ordering::Relaxed);
            }
            let _ = c.delete(key.as_str(), None).await;
        });
    }
    timed(seconds, stop, grants, players).await
}

/// The ZooKeeper handoff limit: handoffs per second between two raw zookeeper-client sessions.
pub async fn zookeeper(connect: &str, seconds: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let mut players = Vec::new();
    for _ in 0..2 {
        let c = zk::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(connect)
            .await
            .expect("zookeeper client");
        let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        match c.create(ZK_PARENT, b"", &open).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => panic!("create {ZK_PARENT}: {e}"),
        }
        let (stop, grants) = (stop.clone(), grants.clone());
        players.push(async move {
            let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let mut mine: Option<String> = None;
            while !stop.load(Ordering::Relaxed) {
                if let Some(path) = mine.take() {
                    c.delete(&path, None).await.expect("delete");
                }
                let (_, seq) = c
                    .create(&format!("{ZK_PARENT}/n-"), b"", &mode)
                    .await
                    .expect("create");
                let own = format!("n-{seq}");
                mine = Some(format!("{ZK_PARENT}/{own}"));
                let ahead = || async {
                    let children = c.list_children(ZK_PARENT).await.expect("read");
                    children.into_iter().filter(|n| *n < own).max()
                };
                if let Some(other) = ahead().await {
                    let path = format!("{ZK_PARENT}/{other}");
                    let (stat, watcher) = c.check_and_watch_stat(&path).await.expect("watch");
                    if stat.is_some() {
                        watcher.changed().await;
                        ahead().await;
                    }
                }
                grants.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(path) = mine {
                let _ = c.delete(&path, None).await;
            }
        });
    }
    timed(seconds, stop, grants, players).await
}

/// Lets the players run for `seconds`, stops them, and returns grants per second.
async fn timed<F>(
    seconds: f64,
    stop: Arc<AtomicBool>,
    grants: Arc<AtomicU64>,
    players: Vec<F>,
) -> f64
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let start = Instant::now();
    let tasks: Vec<_> = players.into_iter().map(tokio::spawn).collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let n = grants.load(Ordering::Relaxed);
    let rate = n as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        // A player waiting on the other when the clock ran out is woken by the other's last
        // delete; bounded in case it is not.
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    rate
}
