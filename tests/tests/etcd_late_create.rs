//! A create that the cluster applies after the session gave it up (its request held up on a
//! member that pauses, served when the member resumes) leaves no entry: the session's create
//! fence makes it fail. Before, the entry stayed on the session's live lease, ahead of every
//! later waiter, and nobody released it.

use std::time::Duration;

use fencelock::conformance::unique_namespace;
use fencelock::Session;
use fencelock_etcd::EtcdBackend;
use fencelock_integration::proxy::{Mode, Proxy};
use fencelock_integration::servers::etcd::EtcdFactory;
use fencelock_integration::servers::Cluster;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(6);
/// Far beyond a create's retries past one held member (its request bound is a third of the
/// TTL).
const WITHIN: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_served_after_its_release_leaves_no_entry() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let member = f.cluster.endpoint(0);
    // Two ways to the same member: one pauses (its requests held, then served late), the
    // other goes on.
    let (paused, open) = (Proxy::start(&member).await, Proxy::start(&member).await);
    let ns = unique_namespace("late_create");
    let backend = EtcdBackend::connect([paused.addr(), open.addr()])
        .await
        .unwrap();
    let s = Session::builder(backend)
        .namespace(&ns)
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    let probe = Session::builder(EtcdBackend::connect([member.clone()]).await.unwrap())
        .namespace(&ns)
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    // The client balances requests over both ways, to the one with fewer in flight: pause
    // one, lock at once, and try again until a create goes the paused way (it is not answered
    // at once); its retry then goes the other.
    let mut held_up = false;
    for _ in 0..40 {
        paused.set(Mode::Hold);
        let m = s.mutex("m").unwrap();
        let mut lock = tokio::spawn(async move { m.lock_timeout(WITHIN).await });
        let quick = tokio::time::timeout(Duration::from_millis(300), &mut lock).await;
        let guard = match quick {
            Ok(done) => done.unwrap().unwrap(),
            Err(_) => {
                held_up = true;
                tokio::time::timeout(WITHIN, lock)
                    .await
                    .expect("the retry past the paused way was not granted")
                    .unwrap()
                    .unwrap()
            }
        };
        guard.release().await.unwrap();
        if held_up {
            break;
        }
        // Whatever went the paused way meanwhile is served, before the next try.
        paused.set(Mode::Pass);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(held_up, "no create went the paused way");
    assert!(probe.list_entries().await.unwrap().is_empty());
    // The member resumes: the held create is served, after the release.
    paused.set(Mode::Pass);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let left = probe.list_entries().await.unwrap();
        assert!(
            left.is_empty(),
            "a create served late left an entry nobody holds: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The session goes on: the lock is free for another session.
    let other = probe.mutex("m").unwrap().try_lock().await.unwrap();
    assert!(other.is_some(), "the lock stayed taken");
    other.unwrap().release().await.unwrap();
    s.close().await.unwrap();
    probe.close().await.unwrap();
}
