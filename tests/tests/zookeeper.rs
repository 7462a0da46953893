//! The conformance suite and the backend contract against a real ZooKeeper server (Debian's
//! `zookeeper` package; skipped with a message when it is missing, a failure in CI).

use fencelock_integration::servers::zookeeper::ZkFactory;

fencelock::conformance_tests!(ZkFactory::shared());

/// A retried create of an attempt whose earlier tries each made a node (their replies lost)
/// keeps one entry of the attempt, the first, and deletes the others: only the first was
/// adopted, and the others stayed in the queue owned by no guard, holding up every waiter
/// behind them until the session ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_create_keeps_one_entry_of_its_attempt() {
    use fencelock::backend::{Backend, EnqueueRequest, EntryKind, QueueId, QueueKind};
    let Some(f) = ZkFactory::shared().await else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("zk_retried");
    let s = f
        .zookeeper()
        .open_session(std::time::Duration::from_secs(10))
        .await
        .unwrap();
    let q = QueueId::new(ns.clone(), "m", QueueKind::Lock);
    let req = EnqueueRequest::new(&q, EntryKind::Exclusive, uuid::Uuid::new_v4(), b"");
    // Two tries whose replies were lost: each made a node.
    let first = s.enqueue(req).await.unwrap().entry;
    let second = s.enqueue(req).await.unwrap().entry;
    assert_ne!(first.key, second.key);
    let adopted = s.enqueue(req.retried()).await.unwrap().entry;
    assert_eq!(adopted.key, first.key, "the first node is adopted");
    s.remove(&adopted).await.unwrap();
    let left = s.list(&ns).await.unwrap();
    assert!(left.is_empty(), "entries of the attempt left: {left:?}");
    s.close().await.unwrap();
}
