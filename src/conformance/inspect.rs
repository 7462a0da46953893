//! Inspection (holder, waiters, candidates), long-held locks, revocation, reentrancy.

use std::time::Duration;

use super::{bounded, open, unique_namespace, wait_entries, Factory, TTL, WAIT};
use crate::{EntryKind, Error};

/// `holder()` and `waiters()` name the sessions in queue order, with tokens and keys;
/// `held_for()` grows; `candidates()` lists an election's leader first.
pub async fn inspection_shows_holder_and_waiters(f: &dyn Factory) {
    let ns = unique_namespace("inspection");
    let (a, b, c) = (
        open(f, &ns, TTL).await,
        open(f, &ns, TTL).await,
        open(f, &ns, TTL).await,
    );
    let m = a.mutex("i").unwrap();
    assert!(m.holder().await.unwrap().is_none());
    let g = m.lock().await.unwrap();
    let (mb, mc) = (b.mutex("i").unwrap(), c.mutex("i").unwrap());
    let tb = tokio::spawn(async move { mb.lock().await.map(drop) });
    wait_entries(&a, "b queued", |l| l.len() == 2).await;
    let tc = tokio::spawn(async move { mc.lock().await.map(drop) });
    wait_entries(&a, "c queued", |l| l.len() == 3).await;
    let holder = m.holder().await.unwrap().expect("a holds");
    assert_eq!(
        (holder.key.as_str(), holder.token, holder.session.as_str()),
        (g.key(), g.token(), a.id().as_str())
    );
    assert_eq!(holder.kind, EntryKind::Exclusive);
    if let Some(created) = holder.created {
        let age = created.elapsed().unwrap_or_default();
        assert!(age < Duration::from_secs(600), "created {age:?} ago");
    }
    let waiters = m.waiters().await.unwrap();
    let ids: Vec<_> = waiters.iter().map(|w| w.session.clone()).collect();
    assert_eq!(ids, [b.id(), c.id()]);
    assert!(waiters[0].token < waiters[1].token);
    let first = g.held_for();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(g.held_for() >= first + Duration::from_millis(20));
    g.release().await.unwrap();
    bounded(WAIT, "b", tb).await.unwrap().unwrap();
    bounded(WAIT, "c", tc).await.unwrap().unwrap();
    // Elections: the leader first, then the candidates in order, with their values.
    let la = a.election("e").unwrap().campaign("A").await.unwrap();
    let eb = b.election("e").unwrap();
    let cb = tokio::spawn(async move { eb.campaign("B").await.map(drop) });
    wait_entries(&a, "candidate queued", |l| {
        l.iter().filter(|k| k.contains("/e")).count() == 2
    })
    .await;
    let cands = a.election("e").unwrap().candidates().await.unwrap();
    let seen: Vec<_> = cands
        .iter()
        .map(|e| (e.session.clone(), e.value.clone()))
        .collect();
    assert_eq!(seen, [(a.id(), b"A".to_vec()), (b.id(), b"B".to_vec())]);
    assert_eq!(cands[0].token, la.epoch());
    la.resign().await.unwrap();
    bounded(WAIT, "candidate", cb).await.unwrap().unwrap();
    for s in [&a, &b, &c] {
        s.close().await.unwrap();
    }
}

/// A waiter asks the holder to let go: the holder's `revoke_requested()` resolves while it
/// still holds (a request, not a release), and its release lets the waiter in. Asking on a
/// free lock asks nobody.
pub async fn revocation_request_reaches_the_holder(f: &dyn Factory) {
    let ns = unique_namespace("revocation");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    assert!(b
        .mutex("r")
        .unwrap()
        .request_revoke()
        .await
        .unwrap()
        .is_none());
    let g = a.mutex("r").unwrap().lock().await.unwrap();
    let asked = g.revoke_requested();
    tokio::pin!(asked);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut asked)
            .await
            .is_err(),
        "nobody asked yet"
    );
    let mb = b.mutex("r").unwrap();
    let waiter = tokio::spawn({
        let mb = b.mutex("r").unwrap();
        async move { mb.lock().await.map(|g| g.token()) }
    });
    wait_entries(&a, "b queued", |l| l.len() == 2).await;
    let who = mb.request_revoke().await.unwrap().expect("a holds");
    assert_eq!((who.token, who.session), (g.token(), a.id()));
    bounded(WAIT, "revoke requested", asked).await;
    assert!(g.is_held(), "a request does not take the lock");
    // A new watch sees the request already made.
    bounded(WAIT, "revoke requested again", g.revoke_requested()).await;
    g.release().await.unwrap();
    let t = bounded(WAIT, "b granted", waiter).await.unwrap().unwrap();
    assert!(t > g.token());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Reentrancy through the guard: same token, no request, released with the last guard. A
/// second `lock()` of the same session is another holder: it waits (bounded here).
pub async fn reentrant_guard_keeps_token(f: &dyn Factory) {
    let ns = unique_namespace("reentrant");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    let m = a.mutex("re").unwrap();
    let outer = m.lock().await.unwrap();
    let inner = outer.reenter().unwrap();
    let innermost = inner.reenter().unwrap();
    assert_eq!(inner.token(), outer.token());
    assert_eq!(a.list_entries().await.unwrap().len(), 1, "no second entry");
    assert!(
        m.try_lock().await.unwrap().is_none(),
        "lock() is another holder"
    );
    let e = m.lock_timeout(Duration::from_millis(50)).await.unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }));
    outer.release().await.unwrap();
    drop(innermost);
    assert!(inner.is_held());
    assert!(b.mutex("re").unwrap().try_lock().await.unwrap().is_none());
    inner.release().await.unwrap();
    assert!(matches!(inner.reenter(), Err(Error::NotHeld(_))));
    let g = bounded(WAIT, "b", b.mutex("re").unwrap().lock())
        .await
        .unwrap();
    assert!(g.token() > outer.token());
    g.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// `Session::queues` finds every queue of the namespace with its entries in order: a lock with
/// a holder and a waiter, a read-write lock, a semaphore's leases and an election (which etcd
/// reports as a lock: same layout).
pub async fn queues_list_the_namespace(f: &dyn Factory) {
    use crate::QueueKind;
    let ns = unique_namespace("queues");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    let g = a.mutex("jobs/a").unwrap().lock().await.unwrap();
    let mb = b.mutex("jobs/a").unwrap();
    let waiter = tokio::spawn(async move { mb.lock().await.map(drop) });
    wait_entries(&a, "b queued", |l| l.len() == 2).await;
    let r = a.rwlock("catalog").unwrap().read().await.unwrap();
    let p = a.semaphore("pool", 2).unwrap().acquire().await.unwrap();
    let l = b.election("primary").unwrap().campaign("B").await.unwrap();
    let queues = a.queues("").await.unwrap();
    let seen: Vec<_> = queues
        .iter()
        .map(|q| (q.name.as_str(), q.kind, q.entries.len()))
        .collect();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[0], ("catalog", QueueKind::ReadWrite, 1));
    assert_eq!(seen[1], ("jobs/a", QueueKind::Lock, 2));
    assert_eq!(seen[2], ("pool/leases", QueueKind::Semaphore, 1));
    assert_eq!(seen[3].0, "primary");
    assert!(matches!(seen[3].1, QueueKind::Election | QueueKind::Lock));
    assert_eq!(queues[1].entries[0].token, g.token());
    assert_eq!(queues[1].entries[1].session, b.id());
    assert_eq!(queues[3].entries[0].value, b"B");
    let jobs = a.queues("jobs/").await.unwrap();
    assert_eq!(jobs.len(), 1);
    for x in [
        r.release().await,
        p.release().await,
        l.resign().await,
        g.release().await,
    ] {
        x.unwrap();
    }
    bounded(WAIT, "waiter", waiter).await.unwrap().unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Keys another tool left under the namespace that map to no fencelock name (etcd:
/// `etcdctl lock {ns}/jobs/` makes `{ns}/jobs//{lease}`) fail no listing: `queues()` still
/// lists fencelock's queues, and `queue_listing()` counts the keys it skipped.
pub async fn foreign_keys_do_not_break_listings(f: &dyn Factory) {
    let ns = unique_namespace("foreign_keys");
    let a = open(f, &ns, TTL).await;
    let g = a.mutex("jobs/a").unwrap().lock().await.unwrap();
    let l = a.election("primary").unwrap().campaign("A").await.unwrap();
    let written = bounded(
        WAIT,
        "write foreign keys",
        f.write_foreign_keys(&ns, &a.id()),
    )
    .await
    .expect("write foreign keys");
    assert!(written > 0);
    let names = |qs: &[crate::QueueInfo]| qs.iter().map(|q| q.name.clone()).collect::<Vec<_>>();
    let listing = a
        .queue_listing("")
        .await
        .expect("foreign keys fail no listing");
    assert_eq!(names(&listing.queues), ["jobs/a", "primary"]);
    assert_eq!(listing.skipped, written, "every foreign key counted");
    assert_eq!(listing.queues[0].entries[0].token, g.token());
    assert_eq!(a.queues("").await.unwrap(), listing.queues);
    let jobs = a.queue_listing("jobs/").await.unwrap();
    assert_eq!(names(&jobs.queues), ["jobs/a"]);
    let none = a.queue_listing("zzz").await.unwrap();
    assert_eq!((none.queues.len(), none.skipped), (0, 0));
    g.release().await.unwrap();
    l.resign().await.unwrap();
    a.close().await.unwrap();
}
