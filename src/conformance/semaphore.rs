//! Counting semaphores: the bound, one token per permit, handover, disagreement, cancellation.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::{bounded, open, unique_namespace, wait_entries, Factory, TTL, WAIT};
use crate::Error;

/// 6 sessions × 8 acquisitions of a 3-permit semaphore: never more than 3 holders at once, the
/// bound reached, and every permit a token of its own.
pub async fn semaphore_bounds_holders(f: &dyn Factory) {
    const PERMITS: usize = 3;
    let ns = unique_namespace("semaphore_bound");
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(StdMutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let s = open(f, &ns, TTL).await;
        let (inside, peak, tokens) = (inside.clone(), peak.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let sem = s.semaphore("pool", PERMITS).unwrap();
            for _ in 0..8 {
                let p = sem.acquire().await.unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                assert!(now <= PERMITS, "{now} holders of {PERMITS} permits");
                assert!(tokens.lock().unwrap().insert(p.token()), "a token twice");
                // Long enough for others to pass the gate meanwhile (a few round trips).
                tokio::time::sleep(Duration::from_millis(25)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                p.release().await.unwrap();
            }
            s.close().await.unwrap();
        }));
    }
    for t in tasks {
        bounded(WAIT * 2, "semaphore workers", t).await.unwrap();
    }
    assert_eq!(tokens.lock().unwrap().len(), 48);
    assert!(
        peak.load(Ordering::SeqCst) >= 2,
        "permits were never held together"
    );
}

/// With both permits of two taken, a third acquirer waits; a release hands its permit over;
/// `try_acquire` on a full semaphore is `None` and leaves nothing; `inspect` shows holders and
/// the waiter.
pub async fn semaphore_waits_and_hands_over(f: &dyn Factory) {
    let ns = unique_namespace("semaphore_handover");
    let (a, b, c) = (
        open(f, &ns, TTL).await,
        open(f, &ns, TTL).await,
        open(f, &ns, TTL).await,
    );
    let p1 = a.semaphore("s", 2).unwrap().acquire().await.unwrap();
    let p2 = b.semaphore("s", 2).unwrap().acquire().await.unwrap();
    let sc = c.semaphore("s", 2).unwrap();
    assert!(sc.try_acquire().await.unwrap().is_none());
    c.flush().await;
    assert_eq!(a.list_entries().await.unwrap().len(), 2, "try left nothing");
    let mut waiter = tokio::spawn(async move { sc.acquire().await });
    // The waiter holds the gate and its lease: 2 leases + 1 lease + 1 gate entry.
    wait_entries(&a, "waiter queued", |l| l.len() == 4).await;
    let (holders, _) = a.semaphore("s", 2).unwrap().inspect().await.unwrap();
    let ids: Vec<_> = holders.iter().map(|h| h.session.clone()).collect();
    assert_eq!(ids, [a.id(), b.id()]);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut waiter)
            .await
            .is_err(),
        "a third permit granted"
    );
    p1.release().await.unwrap();
    let p3 = bounded(WAIT, "handover", waiter).await.unwrap().unwrap();
    assert!(p3.token() > p1.token());
    assert!(p2.is_held());
    p2.release().await.unwrap();
    p3.release().await.unwrap();
    for s in [&a, &b, &c] {
        s.flush().await;
    }
    assert!(a.list_entries().await.unwrap().is_empty());
    for s in [&a, &b, &c] {
        s.close().await.unwrap();
    }
}

/// Participants that disagree on the number of permits get a typed error (and the refused
/// acquirer leaves nothing); zero permits is refused at once.
pub async fn semaphore_disagreement_is_an_error(f: &dyn Factory) {
    let ns = unique_namespace("semaphore_disagree");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    assert!(matches!(
        a.semaphore("s", 0).unwrap_err(),
        Error::InvalidConfig(_)
    ));
    let p = a.semaphore("s", 2).unwrap().acquire().await.unwrap();
    let e = bounded(WAIT, "acquire", b.semaphore("s", 3).unwrap().acquire())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e:?}");
    assert!(!e.is_temporary());
    // Fewer permits than are held: refused at once too, not left waiting at the gate's head
    // for every holder to go (with everyone else queued behind it).
    let fewer = b.semaphore("s", 1).unwrap();
    let e = bounded(WAIT, "try_acquire", fewer.try_acquire())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e:?}");
    let e = bounded(WAIT, "acquire", fewer.acquire()).await.unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e:?}");
    b.flush().await;
    assert_eq!(a.list_entries().await.unwrap(), vec![p.key().to_string()]);
    let q = bounded(
        WAIT,
        "try_acquire",
        b.semaphore("s", 2).unwrap().try_acquire(),
    )
    .await
    .unwrap()
    .expect("a permit was free");
    q.release().await.unwrap();
    p.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Acquisitions cancelled at a spread of instants, and one timed out while waiting, leave
/// nothing behind, neither at the gate nor among the leases.
pub async fn cancelled_acquire_leaves_no_permit(f: &dyn Factory) {
    let ns = unique_namespace("semaphore_cancel");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    let p = a.semaphore("s", 1).unwrap().acquire().await.unwrap();
    let sb = b.semaphore("s", 1).unwrap();
    for i in 0..10u64 {
        let d = Duration::from_micros(i * i * 400);
        assert!(tokio::time::timeout(d, sb.acquire()).await.is_err());
    }
    let e = sb
        .acquire_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    // Timed out at the gate (b waits among the leases, holding it): the same error, with the
    // timeout asked for. (b's cancelled tries flushed first: only its gate and lease entries
    // are counted below, beside a's lease.)
    bounded(WAIT, "flush", b.flush()).await;
    assert_eq!(a.list_entries().await.unwrap(), vec![p.key().to_string()]);
    let c = open(f, &ns, TTL).await;
    // Boxed, not pinned on the stack: dropped below, it is cancelled there.
    let mut b_waits = Box::pin(sb.acquire());
    let at_leases = async {
        while a.list_entries().await.unwrap().len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        r = &mut b_waits => panic!("granted while a holds the permit: {r:?}"),
        () = bounded(WAIT, "b's gate and lease entries", at_leases) => {}
    }
    let (asked, sc) = (Duration::from_millis(100), c.semaphore("s", 1).unwrap());
    let e = tokio::select! {
        r = &mut b_waits => panic!("granted while a holds the permit: {r:?}"),
        r = bounded(WAIT, "c's acquire_timeout", sc.acquire_timeout(asked)) => r.unwrap_err(),
    };
    assert!(
        matches!(e, Error::Timeout { after, .. } if after == asked),
        "{e:?}"
    );
    drop(b_waits);
    bounded(WAIT, "flush", b.flush()).await;
    bounded(WAIT, "flush", c.flush()).await;
    c.close().await.unwrap();
    assert_eq!(a.list_entries().await.unwrap(), vec![p.key().to_string()]);
    p.release().await.unwrap();
    let q = bounded(WAIT, "acquire", sb.acquire()).await.unwrap();
    q.release().await.unwrap();
    b.flush().await;
    assert!(a.list_entries().await.unwrap().is_empty());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A permit dropped without `release()` is released in the background: the next acquirer
/// gets it, and nothing is left once the sessions flush.
pub async fn dropped_permit_releases(f: &dyn Factory) {
    let ns = unique_namespace("semaphore_drop");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    let p = a.semaphore("s", 1).unwrap().acquire().await.unwrap();
    drop(p);
    let q = bounded(
        WAIT,
        "acquire after a drop",
        b.semaphore("s", 1).unwrap().acquire(),
    )
    .await
    .unwrap();
    drop(q);
    a.flush().await;
    b.flush().await;
    assert!(a.list_entries().await.unwrap().is_empty());
    a.close().await.unwrap();
    b.close().await.unwrap();
}
