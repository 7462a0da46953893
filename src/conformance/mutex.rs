//! Mutual exclusion, ordering, tokens, cancellation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::{bounded, open, unique_namespace, wait_entries, Factory, TTL, WAIT};
use crate::{Error, Fence, FencingToken, LostReason};

/// Lock, observe our entry on the server, release, observe it gone.
pub async fn acquire_release(f: &dyn Factory) {
    let ns = unique_namespace("acquire_release");
    let s = open(f, &ns, TTL).await;
    let m = s.mutex("a").unwrap();
    let g = bounded(WAIT, "lock", m.lock()).await.unwrap();
    assert!(g.is_held());
    assert!(g.token() > FencingToken::new(0));
    let list = s.list_entries().await.unwrap();
    assert_eq!(list, vec![g.key().to_string()], "exactly our entry");
    bounded(WAIT, "release", g.release()).await.unwrap();
    assert!(!g.is_held());
    assert!(s.list_entries().await.unwrap().is_empty(), "entry removed");
    s.close().await.unwrap();
}

/// `try_lock` on a held lock gives `None` and leaves no entry; on a free lock it grants.
pub async fn try_lock_contended(f: &dyn Factory) {
    let ns = unique_namespace("try_lock_contended");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let ga = a
        .mutex("a")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .expect("free lock");
    let mb = b.mutex("a").unwrap();
    assert!(
        mb.try_lock().await.unwrap().is_none(),
        "held elsewhere: None"
    );
    assert_eq!(b.list_entries().await.unwrap(), vec![ga.key().to_string()]);
    ga.release().await.unwrap();
    let gb = mb.try_lock().await.unwrap().expect("free again");
    assert!(gb.token() > ga.token());
    // Contention inside one session is also `None`.
    assert!(mb.try_lock().await.unwrap().is_none());
    gb.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Five waiters (on five sessions) queued one after another are granted in that order, with
/// increasing tokens.
pub async fn fifo_five_waiters(f: &dyn Factory) {
    let ns = unique_namespace("fifo_five_waiters");
    let holder = open(f, &ns, TTL).await;
    let g = holder.mutex("q").unwrap().lock().await.unwrap();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let s = open(f, &ns, TTL).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = s.mutex("q").unwrap().lock().await.unwrap();
            order.lock().unwrap().push((i, g.token()));
            g.release().await.unwrap();
            s.close().await.unwrap();
        }));
        // Wait until waiter i is queued before starting the next one.
        wait_entries(&holder, "waiter queued", |l| l.len() == i + 2).await;
    }
    g.release().await.unwrap();
    for t in tasks {
        bounded(WAIT, "waiter done", t).await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let idx: Vec<_> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(idx, vec![0, 1, 2, 3, 4], "FIFO");
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens increase: {order:?}"
    );
    assert!(order[0].1 > g.token());
    holder.close().await.unwrap();
}

/// Tokens strictly increase across successive holders, whether the next holder is another
/// session or the same one.
pub async fn tokens_increase(f: &dyn Factory) {
    let ns = unique_namespace("tokens_increase");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let (ma, mb) = (a.mutex("t").unwrap(), b.mutex("t").unwrap());
    let mut last = FencingToken::new(0);
    for i in 0..6 {
        let m = if i % 3 == 2 { &mb } else { &ma };
        let g = bounded(WAIT, "lock", m.lock()).await.unwrap();
        assert!(g.token() > last, "{} after {last}", g.token());
        last = g.token();
        g.release().await.unwrap();
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// 8 sessions × 50 contended acquisitions: a fenced shared counter and an overlap detector show
/// no two holders at once and no stale token admitted.
pub async fn contended_counter(f: &dyn Factory) {
    contended_counter_with(f, 8, 50).await
}

/// [`contended_counter`] with a chosen size.
pub async fn contended_counter_with(f: &dyn Factory, sessions: usize, rounds: usize) {
    let ns = unique_namespace("contended_counter");
    let fence = Arc::new(Fence::new());
    let inside = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(StdMutex::new(0usize));
    let mut tasks = Vec::new();
    for _ in 0..sessions {
        let s = open(f, &ns, TTL).await;
        let (fence, inside, counter) = (fence.clone(), inside.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            let m = s.mutex("counter").unwrap();
            for _ in 0..rounds {
                let g = m.lock().await.unwrap();
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                fence.admit(g.token()).expect("fence admits the holder");
                let v = *counter.lock().unwrap();
                tokio::task::yield_now().await;
                *counter.lock().unwrap() = v + 1;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
            s
        }));
    }
    let mut sessions_done = Vec::new();
    for t in tasks {
        sessions_done.push(bounded(WAIT * 4, "contenders", t).await.unwrap());
    }
    assert_eq!(
        *counter.lock().unwrap(),
        sessions * rounds,
        "no lost update"
    );
    assert!(
        sessions_done[0].list_entries().await.unwrap().is_empty(),
        "no leftover entry"
    );
    for s in sessions_done {
        s.close().await.unwrap();
    }
}

/// Tasks of one session queue locally: one remote entry at a time, FIFO, fresh token each.
pub async fn local_queue_one_remote_entry(f: &dyn Factory) {
    let ns = unique_namespace("local_queue");
    let s = open(f, &ns, TTL).await;
    let m = Arc::new(s.mutex("l").unwrap());
    let g = m.lock().await.unwrap();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let (m, order) = (m.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = m.lock().await.unwrap();
            order.lock().unwrap().push((i, g.token()));
            g.release().await.unwrap();
        }));
        // Let the task reach the local queue before starting the next one.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        s.list_entries().await.unwrap().len(),
        1,
        "one remote entry per session"
    );
    g.release().await.unwrap();
    for t in tasks {
        bounded(WAIT, "local waiter", t).await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.iter().map(|o| o.0).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1));
    s.close().await.unwrap();
}

/// Dropping `lock()` futures at many points (before the create, after it, while waiting, and
/// racing with a grant) leaves no entry behind, and the lock stays usable.
pub async fn cancelled_lock_leaves_no_entry(f: &dyn Factory) {
    let ns = unique_namespace("cancelled_lock");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let ga = a.mutex("c").unwrap().lock().await.unwrap();
    let mb = b.mutex("c").unwrap();
    // Cancel at a spread of instants: some before the request leaves, some mid-flight, some
    // while waiting on the predecessor.
    for i in 0..12u64 {
        let d = Duration::from_micros(i * i * 300);
        let r = tokio::time::timeout(d, mb.lock()).await;
        assert!(r.is_err(), "the lock is held by a: no grant");
    }
    // Cancel once definitely while waiting (after the earlier cleanups freed the local slot).
    bounded(WAIT, "flush", b.flush()).await;
    {
        let fut = mb.lock();
        tokio::pin!(fut);
        let waited = tokio::time::timeout(Duration::from_millis(1), &mut fut).await;
        assert!(waited.is_err());
        wait_entries(&a, "b queued", |l| l.len() == 2).await;
    }
    bounded(WAIT, "flush", b.flush()).await;
    assert_eq!(
        a.list_entries().await.unwrap(),
        vec![ga.key().to_string()],
        "only a's entry"
    );
    ga.release().await.unwrap();
    // A grant racing with the cancel: release a while b's lock() is being dropped.
    for i in 0..6u64 {
        let g = a.mutex("c").unwrap().lock().await.unwrap();
        let mut fut = Box::pin(mb.lock());
        let _ = tokio::time::timeout(Duration::from_millis(2), &mut fut).await;
        let release = g.release();
        let _ = tokio::time::timeout(Duration::from_micros(i * 500), async {
            tokio::join!(release, &mut fut)
        })
        .await;
        drop(fut);
        drop(g);
        bounded(WAIT, "flush", a.flush()).await;
        bounded(WAIT, "flush", b.flush()).await;
        let left = a.list_entries().await.unwrap();
        assert!(
            left.is_empty(),
            "race {i} left {left:?} (a={}, b={})",
            a.id(),
            b.id()
        );
    }
    // Still usable afterwards, and nothing left.
    let gb = bounded(WAIT, "lock after cancels", mb.lock())
        .await
        .unwrap();
    gb.release().await.unwrap();
    assert!(a.list_entries().await.unwrap().is_empty());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// An expired `lock_timeout` returns [`Error::Timeout`] with its entry already removed.
pub async fn lock_timeout_leaves_no_entry(f: &dyn Factory) {
    let ns = unique_namespace("lock_timeout");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let ga = a.mutex("t").unwrap().lock().await.unwrap();
    let mb = b.mutex("t").unwrap();
    for ms in [0, 50, 300] {
        let r = bounded(
            WAIT,
            "lock_timeout",
            mb.lock_timeout(Duration::from_millis(ms)),
        )
        .await;
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert_eq!(
            a.list_entries().await.unwrap(),
            vec![ga.key().to_string()],
            "no entry left"
        );
    }
    ga.release().await.unwrap();
    let gb = mb
        .lock_timeout(WAIT)
        .await
        .expect("free lock within the timeout");
    gb.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Every `*_timeout` of the lock family (a semaphore's `acquire_timeout`, a read-write lock's
/// `read_timeout` and `write_timeout`, an election's `campaign_timeout`, a multi-lock's
/// `lock_timeout`) has removed its entries, confirmed by the cluster, when it returns
/// [`Error::Timeout`]: a read of the server right after the error finds only the holders'
/// entries, every time (a removal left to the background task would lose that race often).
pub async fn every_timeout_leaves_no_entry(f: &dyn Factory) {
    const TRIES: usize = 10;
    let ns = unique_namespace("every_timeout");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let permit = a.semaphore("s", 1).unwrap().acquire().await.unwrap();
    let writer = a.rwlock("rw").unwrap().write().await.unwrap();
    let leader = a.election("e").unwrap().campaign(b"a").await.unwrap();
    let held = a.mutex("m/2").unwrap().lock().await.unwrap();
    let mut expected: Vec<String> = [permit.key(), writer.key(), leader.key(), held.key()]
        .iter()
        .map(|k| k.to_string())
        .collect();
    expected.sort();
    let check = |what: &str, r: crate::Result<()>, list: Vec<String>| {
        assert!(matches!(r, Err(Error::Timeout { .. })), "{what}: {r:?}");
        assert_eq!(list, expected, "{what}: an entry was left when it returned");
    };
    let sem = b.semaphore("s", 1).unwrap();
    let rw = b.rwlock("rw").unwrap();
    let e = b.election("e").unwrap();
    let ml = b.multi_lock(["m/1", "m/2", "m/3"]).unwrap();
    for i in 0..TRIES {
        let d = Duration::from_millis([0, 20, 50][i % 3]);
        let r = bounded(WAIT, "acquire_timeout", sem.acquire_timeout(d)).await;
        check(
            "acquire_timeout",
            r.map(drop),
            b.list_entries().await.unwrap(),
        );
        let r = bounded(WAIT, "read_timeout", rw.read_timeout(d)).await;
        check("read_timeout", r.map(drop), b.list_entries().await.unwrap());
        let r = bounded(WAIT, "write_timeout", rw.write_timeout(d)).await;
        check(
            "write_timeout",
            r.map(drop),
            b.list_entries().await.unwrap(),
        );
        let r = bounded(WAIT, "campaign_timeout", e.campaign_timeout(b"b", d)).await;
        check(
            "campaign_timeout",
            r.map(drop),
            b.list_entries().await.unwrap(),
        );
        let r = bounded(WAIT, "multi lock_timeout", ml.lock_timeout(d)).await;
        check(
            "multi lock_timeout",
            r.map(drop),
            b.list_entries().await.unwrap(),
        );
    }
    drop((permit, writer, leader, held));
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The seeds' timeline: A holds token t; A's heartbeats stop (as if paused); A's `lost()`
/// fires before B is granted; B's token is larger; A's late write is refused by the fence.
pub async fn stale_holder_is_fenced(f: &dyn Factory) {
    let ns = unique_namespace("stale_holder");
    let ttl = f.short_ttl();
    let a = open(f, &ns, ttl).await;
    let b = open(f, &ns, crate::conformance::TTL).await;
    let fence = Fence::new();
    let ga = a.mutex("r").unwrap().lock().await.unwrap();
    let t = ga.token();
    fence.admit(t).unwrap();
    let a_lost = tokio::spawn({
        let lost = ga.lost();
        async move {
            let r = lost.await;
            (r, tokio::time::Instant::now())
        }
    });
    a.halt_heartbeats(); // A is "paused": no more heartbeats
    let gb = bounded(
        ttl * 4 + WAIT,
        "B granted after A's expiry",
        b.mutex("r").unwrap().lock(),
    )
    .await
    .unwrap();
    let b_at = tokio::time::Instant::now();
    let (reason, a_at) = bounded(WAIT, "A lost", a_lost).await.unwrap();
    assert!(
        a_at <= b_at,
        "A's lost() ({reason}) fired before B was granted"
    );
    assert!(!ga.is_held());
    assert!(gb.token() > t, "B's token {} > A's {t}", gb.token());
    fence.admit(gb.token()).unwrap();
    assert!(
        matches!(fence.admit(t), Err(Error::StaleToken { .. })),
        "A's late write is refused"
    );
    gb.release().await.unwrap();
    b.close().await.unwrap();
}

/// Releasing twice is an error, and never deletes another holder's entry.
pub async fn release_twice(f: &dyn Factory) {
    let ns = unique_namespace("release_twice");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let ga = a.mutex("r").unwrap().lock().await.unwrap();
    ga.release().await.unwrap();
    assert!(matches!(
        ga.release().await,
        Err(Error::NotHeld(LostReason::Released))
    ));
    let gb = b.mutex("r").unwrap().lock().await.unwrap();
    // Same session, same key again: the old guard must not touch the new entry.
    let ga2 = a.mutex("r2").unwrap().lock().await.unwrap();
    ga2.release().await.unwrap();
    let ga3 = a.mutex("r2").unwrap().lock().await.unwrap();
    assert!(matches!(ga.release().await, Err(Error::NotHeld(_))));
    assert!(matches!(ga2.release().await, Err(Error::NotHeld(_))));
    assert!(gb.is_held() && ga3.is_held());
    let list = a.list_entries().await.unwrap();
    assert!(list.contains(&gb.key().to_string()) && list.contains(&ga3.key().to_string()));
    gb.release().await.unwrap();
    ga3.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Dropping a guard releases it in the background: the next waiter is granted.
pub async fn dropped_guard_releases(f: &dyn Factory) {
    let ns = unique_namespace("dropped_guard");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let ga = a.mutex("d").unwrap().lock().await.unwrap();
    let t = ga.token();
    let waiter = tokio::spawn(async move { b.mutex("d").unwrap().lock().await.map(|g| g.token()) });
    wait_entries(&a, "b queued", |l| l.len() == 2).await;
    drop(ga);
    let tb = bounded(WAIT, "b granted", waiter).await.unwrap().unwrap();
    assert!(tb > t);
    a.close().await.unwrap();
}
