//! A create that the cluster applies after the session gave it up (its request held up on a
//! member that pauses, served when the member resumes) leaves no entry: the session's create
//! fence makes it fail, or the removal that follows finds and removes what it made. Before,
//! the entry stayed on the session's live lease, ahead of every later waiter, and nobody
//! released it. And a release held up the same way, sent again meanwhile, is ours whichever
//! copy the member applies first; a `proclaim` held up so does not bring its value back over a
//! later one's.

use std::time::Duration;

use fencelock::conformance::{unique_namespace, Factory};
use fencelock::{Guard, Session};
use fencelock_etcd::EtcdBackend;
use fencelock_integration::proxy::{Mode, Proxy};
use fencelock_integration::servers::etcd::EtcdFactory;
use fencelock_integration::servers::Cluster;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(6);
/// Far beyond a create's retries past one held member (its request bound is a third of the
/// TTL).
const WITHIN: Duration = Duration::from_secs(30);

/// A session with two ways to one member (`paused` holds its requests, to serve them late
/// when set back to `Pass`), a probe session on the member directly, and a lock of the first
/// session whose first create went the paused way and is held there (granted by its retry,
/// which went the other).
struct Setup {
    paused: Proxy,
    _open: Proxy,
    s: Session,
    probe: Session,
    guard: Guard,
}

async fn setup(f: &EtcdFactory, label: &str) -> Setup {
    let member = f.cluster.endpoint(0);
    let (paused, open) = (Proxy::start(&member).await, Proxy::start(&member).await);
    let ns = unique_namespace(label);
    let backend = EtcdBackend::connect([paused.addr(), open.addr()])
        .await
        .unwrap();
    let start = |backend: EtcdBackend| Session::builder(backend).namespace(&ns).ttl(TTL).start();
    let s = start(backend).await.unwrap();
    let probe = start(EtcdBackend::connect([member]).await.unwrap())
        .await
        .unwrap();
    // The client balances requests over both ways, to the one with fewer in flight: pause
    // one, lock at once, and try again until a create goes the paused way (it is not answered
    // at once).
    for _ in 0..40 {
        paused.set(Mode::Hold);
        let m = s.mutex("m").unwrap();
        let mut lock = tokio::spawn(async move { m.lock_timeout(WITHIN).await });
        match tokio::time::timeout(Duration::from_millis(300), &mut lock).await {
            Ok(done) => done.unwrap().unwrap().release().await.unwrap(),
            Err(_) => {
                let guard = tokio::time::timeout(WITHIN, lock)
                    .await
                    .expect("the retry past the paused way was not granted")
                    .unwrap()
                    .unwrap();
                return Setup {
                    paused,
                    _open: open,
                    s,
                    probe,
                    guard,
                };
            }
        }
        // Whatever went the paused way meanwhile is served, before the next try.
        paused.set(Mode::Pass);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no create went the paused way");
}

/// Checks for 3 s that the namespace holds no entry, then that another session gets the lock.
async fn nothing_left(probe: &Session) {
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let left = probe.list_entries().await.unwrap();
        assert!(
            left.is_empty(),
            "a create served late left an entry nobody holds: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let other = probe.mutex("m").unwrap().try_lock().await.unwrap();
    assert!(other.is_some(), "the lock stayed taken");
    other.unwrap().release().await.unwrap();
}

/// Released, then the held create is served: it fails against the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_served_after_its_release_leaves_no_entry() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let t = setup(&f, "late_create").await;
    t.guard.release().await.unwrap();
    assert!(t.probe.list_entries().await.unwrap().is_empty());
    t.paused.set(Mode::Pass);
    nothing_left(&t.probe).await;
    t.s.close().await.unwrap();
    t.probe.close().await.unwrap();
}

/// The entry deleted by an operator while held, the held create served (the key is free, and
/// the fence has not moved: it succeeds), then the holder releases: the release finds the key
/// made again and removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_served_after_an_operator_deleted_the_entry_leaves_no_entry() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let t = setup(&f, "late_create_deleted").await;
    f.delete_as_admin(t.guard.key()).await.unwrap();
    t.paused.set(Mode::Pass);
    let until = Instant::now() + WITHIN;
    while t.probe.list_entries().await.unwrap().is_empty() {
        assert!(Instant::now() < until, "the held create was never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Deleted under it: the release reports the loss, and removes what the late create made.
    let _ = t.guard.release().await;
    nothing_left(&t.probe).await;
    t.s.close().await.unwrap();
    t.probe.close().await.unwrap();
}

/// The fence key deleted by an operator once it was put: the session puts it again when a
/// create of its own finds it gone, so the held create, served then, still fails against it
/// (without that, the session's next create re-learnt the fence as absent and the held create,
/// sent expecting it absent, passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_fence_is_put_again() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let t = setup(&f, "late_create_fence_deleted").await;
    t.guard.release().await.unwrap();
    let ns = t.s.namespace().to_string();
    f.delete_as_admin(&format!("{ns}/./{}", t.s.id()))
        .await
        .unwrap();
    // A create of the session meets the missing fence.
    let other = t.s.mutex("n").unwrap().lock().await.unwrap();
    other.release().await.unwrap();
    // The held create is served now; `nothing_left` watches for 3 s.
    t.paused.set(Mode::Pass);
    nothing_left(&t.probe).await;
    t.s.close().await.unwrap();
    t.probe.close().await.unwrap();
}

/// A release held up on a member that pauses is sent again (hedged); when the member resumes,
/// the copies are applied in any order, and the one whose answer comes first may be one that
/// found the entry gone, removed by another copy: the release is ours all the same. (It was
/// taken for someone else's deletion: `NotHeld(EntryDeleted)`, the command's exit 76 for a lock
/// never lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_twice_to_a_paused_member_is_ours() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let proxy = Proxy::start(&f.cluster.endpoint(0)).await;
    let ns = unique_namespace("release_held");
    let backend = EtcdBackend::connect([proxy.addr()]).await.unwrap();
    let s = Session::builder(backend)
        .namespace(&ns)
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    for round in 0..8 {
        let guard = s.mutex("m").unwrap().lock().await.unwrap();
        proxy.set(Mode::Hold);
        let release = tokio::spawn(async move { guard.release().await });
        // Past two hedges (every quarter of the request bound, a third of the TTL).
        tokio::time::sleep(TTL / 3 / 4 * 2 + Duration::from_millis(200)).await;
        proxy.set(Mode::Pass);
        let r = tokio::time::timeout(WITHIN, release)
            .await
            .expect("the release ended")
            .unwrap();
        assert!(r.is_ok(), "round {round}: {r:?}");
    }
    s.close().await.unwrap();
}

/// A `proclaim` held up on the paused way (granted by its retry, which went the other), then a
/// later one: the first one's try, served when the member resumes, does not bring its value
/// back. It did: the leader's value went back to the older one until the next `proclaim`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_proclaim_does_not_bring_an_older_value_back() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let member = f.cluster.endpoint(0);
    let (paused, open) = (Proxy::start(&member).await, Proxy::start(&member).await);
    let ns = unique_namespace("late_proclaim");
    let start = |backend: EtcdBackend| Session::builder(backend).namespace(&ns).ttl(TTL).start();
    let backend = EtcdBackend::connect([paused.addr(), open.addr()])
        .await
        .unwrap();
    let s = start(backend).await.unwrap();
    let probe = start(EtcdBackend::connect([member]).await.unwrap())
        .await
        .unwrap();
    let leadership = std::sync::Arc::new(s.election("e").unwrap().campaign("v0").await.unwrap());
    let quick = Duration::from_millis(300);
    for round in 0..40 {
        paused.set(Mode::Hold);
        let (l, old) = (leadership.clone(), format!("old-{round}"));
        let mut first = tokio::spawn(async move { l.proclaim(old).await });
        let held = tokio::time::timeout(quick, &mut first).await.is_err();
        if held {
            let done = tokio::time::timeout(WITHIN, first).await;
            done.expect("the retry past the paused way")
                .unwrap()
                .unwrap();
            // The later one must go the open way: a try of its own held too, served after
            // the first one's, would hide what that one does.
            let new = format!("new-{round}");
            if let Ok(r) = tokio::time::timeout(quick, leadership.proclaim(&new)).await {
                r.unwrap();
                paused.set(Mode::Pass);
                // What the paused way kept is served first thing (bounded, not awaited: no
                // event tells that a request was applied).
                tokio::time::sleep(Duration::from_secs(3)).await;
                let leader = probe.election("e").unwrap().leader().await.unwrap();
                let value = leader.expect("a leader").value;
                assert_eq!(String::from_utf8_lossy(&value), new, "round {round}");
                s.close().await.unwrap();
                probe.close().await.unwrap();
                return;
            }
        }
        // Whatever went the paused way meanwhile is served, before the next try.
        paused.set(Mode::Pass);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no proclaim went the paused way with the next one going the other");
}
