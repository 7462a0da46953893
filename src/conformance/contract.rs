//! The backend contract itself: what [`BackendSession`] promises, checked on raw sessions
//! without the core's retries and local queue in between.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::{bounded, unique_namespace, Factory, TTL, WAIT};
use crate::backend::{BackendSession, EnqueueRequest, Entry, EntryKind, QueueId, QueueKind};
use crate::Error;

/// Whether `entry` (that very one: its key and its token) is in `queue`, as `s` reads it.
async fn present(s: &dyn BackendSession, queue: &QueueId, entry: &Entry) -> bool {
    s.inspect(queue)
        .await
        .unwrap()
        .iter()
        .any(|i| i.key == entry.key && i.token == entry.token)
}

async fn raw(f: &dyn Factory, ttl: Duration) -> Arc<dyn BackendSession> {
    bounded(WAIT, "open a raw session", f.backend().open_session(ttl))
        .await
        .expect("open a raw session")
}

fn lock(ns: &str, name: &str) -> QueueId {
    QueueId::new(ns, name, QueueKind::Lock)
}

fn req(q: &QueueId, attempt: Uuid) -> EnqueueRequest<'_> {
    EnqueueRequest::new(q, EntryKind::Exclusive, attempt, b"")
}

/// A retry of an attempt whose entry exists finds that entry (same key, same token) instead of
/// creating a second one; a retry never adopts another session's entry, even one carrying the
/// same attempt id.
pub async fn contract_enqueue_is_idempotent_per_attempt(f: &dyn Factory) {
    let ns = unique_namespace("contract_idempotent");
    let (a, b) = (raw(f, TTL).await, raw(f, TTL).await);
    let q = lock(&ns, "q");
    let attempt = Uuid::new_v4();
    // The first try's reply is "lost": we drop what it returned.
    let first = a.enqueue(req(&q, attempt)).await.unwrap();
    let again = a.enqueue(req(&q, attempt).retried()).await.unwrap();
    assert_eq!(again.entry, first.entry, "the same entry, found again");
    assert!(again.is_head());
    assert_eq!(a.list(&ns).await.unwrap(), vec![first.entry.key.clone()]);
    // b's retry of an attempt id a used creates b's own entry, behind a's.
    let theirs = b.enqueue(req(&q, attempt).retried()).await.unwrap();
    assert_ne!(theirs.entry.key, first.entry.key);
    assert_eq!(theirs.ahead.len(), 1);
    assert_eq!(theirs.ahead[0].key, first.entry.key);
    assert_eq!(a.list(&ns).await.unwrap().len(), 2);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// `abandon` deletes what an attempt created, succeeds when nothing was created, and never
/// touches another session's entry.
pub async fn contract_abandon_removes_only_the_attempt(f: &dyn Factory) {
    let ns = unique_namespace("contract_abandon");
    let (a, b) = (raw(f, TTL).await, raw(f, TTL).await);
    let q = lock(&ns, "q");
    let attempt = Uuid::new_v4();
    let theirs = b.enqueue(req(&q, attempt)).await.unwrap();
    a.enqueue(req(&q, attempt)).await.unwrap();
    a.abandon(&q, EntryKind::Exclusive, attempt).await.unwrap();
    assert_eq!(a.list(&ns).await.unwrap(), vec![theirs.entry.key.clone()]);
    // Nothing to abandon: fine, twice.
    a.abandon(&q, EntryKind::Exclusive, attempt).await.unwrap();
    a.abandon(&q, EntryKind::Exclusive, Uuid::new_v4())
        .await
        .unwrap();
    assert!(present(&*b, &q, &theirs.entry).await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// An enqueue returns every entry ahead of its own, in queue order, and positions and tokens
/// increase with arrival.
pub async fn contract_ahead_lists_the_queue_in_order(f: &dyn Factory) {
    let ns = unique_namespace("contract_ahead");
    let q = lock(&ns, "q");
    let mut sessions = Vec::new();
    let mut entries = Vec::new();
    for i in 0..4 {
        let s = raw(f, TTL).await;
        let e = s.enqueue(req(&q, Uuid::new_v4())).await.unwrap();
        let keys: Vec<&str> = e.ahead.iter().map(|p| p.key.as_str()).collect();
        let expected: Vec<&str> = entries
            .iter()
            .map(|e: &crate::backend::Entry| e.key.as_str())
            .collect();
        assert_eq!(keys, expected, "entry {i} sees the earlier ones, in order");
        assert!(e.ahead.iter().all(|p| p.kind == EntryKind::Exclusive));
        if let Some(last) = entries.last() {
            assert!(e.entry.order > last.order && e.entry.token > last.token);
        }
        entries.push(e.entry);
        sessions.push(s);
    }
    // A nested lock's entries (`q/sub` under `q`) are not in `q`'s queue.
    let nested = sessions[0]
        .enqueue(req(&lock(&ns, "q/sub"), Uuid::new_v4()))
        .await
        .unwrap();
    assert!(nested.is_head());
    let late = raw(f, TTL).await;
    let e = late.enqueue(req(&q, Uuid::new_v4())).await.unwrap();
    assert_eq!(e.ahead.len(), 4, "{:?}", e.ahead);
    for s in sessions.into_iter().chain([late]) {
        s.close().await.unwrap();
    }
}

/// `still_ahead` returns the nearest entries created before one's own (of a kind, if asked),
/// in queue order, without nested locks' entries; fewer once some went; and fails with
/// `EntryVanished` once one's own entry is gone.
pub async fn contract_still_ahead_reads_the_nearest(f: &dyn Factory) {
    let ns = unique_namespace("contract_still_ahead");
    let q = lock(&ns, "q");
    let mut sessions = Vec::new();
    let mut entries = Vec::new();
    for _ in 0..4 {
        let s = raw(f, TTL).await;
        entries.push(s.enqueue(req(&q, Uuid::new_v4())).await.unwrap().entry);
        // Entries of a nested lock, created in between, must never count.
        s.enqueue(req(&lock(&ns, "q/sub"), Uuid::new_v4()))
            .await
            .unwrap();
        sessions.push(s);
    }
    let (last, own) = (&sessions[3], &entries[3]);
    let keys = |v: Vec<crate::backend::Peer>| v.into_iter().map(|p| p.key).collect::<Vec<String>>();
    let nearest = last.still_ahead(own, &q, None, 1).await.unwrap();
    assert_eq!(keys(nearest), vec![entries[2].key.clone()]);
    let two = last.still_ahead(own, &q, None, 2).await.unwrap();
    assert_eq!(
        keys(two),
        vec![entries[1].key.clone(), entries[2].key.clone()]
    );
    let all = last.still_ahead(own, &q, None, 10).await.unwrap();
    assert_eq!(all.len(), 3);
    assert!(sessions[2].remove(&entries[2]).await.unwrap());
    let nearest = last.still_ahead(own, &q, None, 1).await.unwrap();
    assert_eq!(keys(nearest), vec![entries[1].key.clone()]);
    assert!(sessions[0]
        .still_ahead(&entries[0], &q, None, 3)
        .await
        .unwrap()
        .is_empty());
    // Of a kind: a reader waits for the nearest writer ahead, whatever readers follow it.
    let rw = QueueId::new(ns.as_str(), "rw", QueueKind::ReadWrite);
    let rreq = |k| EnqueueRequest::new(&rw, k, Uuid::new_v4(), b"");
    let w = sessions[0]
        .enqueue(rreq(EntryKind::Exclusive))
        .await
        .unwrap();
    sessions[1].enqueue(rreq(EntryKind::Shared)).await.unwrap();
    let r = sessions[3].enqueue(rreq(EntryKind::Shared)).await.unwrap();
    assert_eq!(r.ahead.len(), 2);
    let writers = sessions[3]
        .still_ahead(&r.entry, &rw, Some(EntryKind::Exclusive), 1)
        .await
        .unwrap();
    assert_eq!(keys(writers), vec![w.entry.key.clone()]);
    assert!(sessions[3].remove(own).await.unwrap());
    let e = last.still_ahead(own, &q, None, 1).await.unwrap_err();
    assert!(matches!(e, Error::EntryVanished { .. }), "{e:?}");
    for s in sessions {
        s.close().await.unwrap();
    }
}

/// `wait` returns when its target is deleted, however close the deletion comes to the call
/// (no deletion slips between the watch and the read); at once for a target already gone; and
/// fails with `EntryVanished` when the waiter's own entry is gone.
pub async fn contract_wait_never_misses_a_racing_deletion(f: &dyn Factory) {
    let ns = unique_namespace("contract_wait");
    let (a, b) = (raw(f, TTL).await, raw(f, TTL).await);
    for i in 0..20u64 {
        let q = lock(&ns, &format!("q{i}"));
        let ea = a.enqueue(req(&q, Uuid::new_v4())).await.unwrap();
        let eb = b.enqueue(req(&q, Uuid::new_v4())).await.unwrap();
        let target = eb.ahead[0].clone();
        let b2 = b.clone();
        let own = eb.entry.clone();
        let waiting = tokio::spawn(async move { b2.wait(&own, &target).await });
        // Delete at a spread of instants around the wait's start.
        tokio::time::sleep(Duration::from_micros(i * i * 150)).await;
        assert!(a.remove(&ea.entry).await.unwrap());
        bounded(WAIT, "wait sees the deletion", waiting)
            .await
            .unwrap()
            .unwrap();
        // Already gone: at once.
        bounded(
            Duration::from_secs(5),
            "wait on a gone target",
            b.wait(&eb.entry, &eb.ahead[0]),
        )
        .await
        .unwrap();
        assert!(b.remove(&eb.entry).await.unwrap());
    }
    // Our own entry gone: the wait fails rather than waits.
    let q = lock(&ns, "vanished");
    let _ea = a.enqueue(req(&q, Uuid::new_v4())).await.unwrap();
    let eb = b.enqueue(req(&q, Uuid::new_v4())).await.unwrap();
    f.delete_as_admin(&eb.entry.key).await.unwrap();
    let r = bounded(
        WAIT,
        "wait with our entry gone",
        b.wait(&eb.entry, &eb.ahead[0]),
    )
    .await;
    assert!(matches!(r, Err(Error::EntryVanished { .. })), "{r:?}");
    assert!(!present(&*b, &q, &eb.entry).await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// `remove` and `set_value` are guarded by the entry's identity: after a session releases and
/// queues again (on etcd, under the same key), the old entry's remove deletes nothing, and the
/// new entry survives.
pub async fn contract_guarded_remove_never_deletes_a_newer_entry(f: &dyn Factory) {
    let ns = unique_namespace("contract_guarded");
    let a = raw(f, TTL).await;
    let q = lock(&ns, "q");
    let old = a.enqueue(req(&q, Uuid::new_v4())).await.unwrap().entry;
    assert!(a.remove(&old).await.unwrap());
    let new = a.enqueue(req(&q, Uuid::new_v4())).await.unwrap().entry;
    assert!(new.token > old.token);
    assert!(!a.remove(&old).await.unwrap(), "the old entry is gone");
    assert!(!a.set_value(&old, b"late").await.unwrap());
    assert!(!present(&*a, &q, &old).await);
    assert!(present(&*a, &q, &new).await, "the new entry survives");
    assert_eq!(a.list(&ns).await.unwrap(), vec![new.key.clone()]);
    a.close().await.unwrap();
}

/// `enqueue_all` creates an entry in every queue, or in none when any of them is taken; a
/// retry of the same attempts creates no duplicates.
pub async fn contract_enqueue_all_is_all_or_nothing(f: &dyn Factory) {
    let ns = unique_namespace("contract_all");
    let (a, b) = (raw(f, TTL).await, raw(f, TTL).await);
    let (q1, q2, q3) = (lock(&ns, "x"), lock(&ns, "y"), lock(&ns, "y/z"));
    let held = b.enqueue(req(&q2, Uuid::new_v4())).await.unwrap();
    let attempts = [Uuid::new_v4(), Uuid::new_v4()];
    let reqs = [req(&q1, attempts[0]), req(&q2, attempts[1])];
    assert!(a.enqueue_all(&reqs).await.unwrap().is_none(), "y is taken");
    assert_eq!(
        a.list(&ns).await.unwrap(),
        vec![held.entry.key.clone()],
        "nothing created"
    );
    assert!(b.remove(&held.entry).await.unwrap());
    // A nested lock's entry does not make `y` taken.
    let nested = b.enqueue(req(&q3, Uuid::new_v4())).await.unwrap();
    let got = a.enqueue_all(&reqs).await.unwrap().expect("both free");
    assert_eq!(got.len(), 2);
    for (e, q) in got.iter().zip([&q1, &q2]) {
        assert!(present(&*a, q, e).await);
    }
    let retried = [reqs[0].retried(), reqs[1].retried()];
    let again = a.enqueue_all(&retried).await.unwrap().expect("a retry");
    assert_eq!(a.list(&ns).await.unwrap().len(), 3, "no duplicates");
    for (e, q) in again.iter().zip([&q1, &q2]) {
        assert!(present(&*a, q, e).await);
    }
    assert!(b.remove(&nested.entry).await.unwrap());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A session whose `keep_alive` is never called ends within about one TTL, and its entries go;
/// a session kept alive lives on.
pub async fn contract_session_ends_without_keep_alive(f: &dyn Factory) {
    let ns = unique_namespace("contract_keep_alive");
    let ttl = f.short_ttl();
    let silent = raw(f, ttl).await;
    let beating = raw(f, ttl).await;
    let q = lock(&ns, "q");
    let es = silent.enqueue(req(&q, Uuid::new_v4())).await.unwrap();
    let eb = beating.enqueue(req(&q, Uuid::new_v4())).await.unwrap();
    let ttl = silent.ttl();
    let start = Instant::now();
    let limit = ttl * 3 + Duration::from_secs(5);
    loop {
        beating.keep_alive().await.unwrap();
        if !present(&*beating, &q, &es.entry).await {
            break;
        }
        assert!(
            start.elapsed() < limit,
            "the silent session's entry outlived {limit:?}"
        );
        tokio::time::sleep(ttl / 10).await;
    }
    assert!(
        start.elapsed() >= ttl / 2,
        "it went after {:?}, well before its TTL of {ttl:?}",
        start.elapsed()
    );
    assert!(matches!(
        silent.keep_alive().await,
        Err(Error::SessionLost(_))
    ));
    assert!(present(&*beating, &q, &eb.entry).await, "kept alive");
    beating.close().await.unwrap();
}

/// `wait_own_gone` resolves when one's entry is deleted by someone else, and at once when it is
/// gone already.
pub async fn contract_own_entry_deletion_is_seen(f: &dyn Factory) {
    let ns = unique_namespace("contract_own_gone");
    let a = raw(f, TTL).await;
    let e = a
        .enqueue(req(&lock(&ns, "q"), Uuid::new_v4()))
        .await
        .unwrap();
    let a2 = a.clone();
    let own = e.entry.clone();
    let watching = tokio::spawn(async move { a2.wait_own_gone(&own).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!watching.is_finished(), "our entry is still there");
    f.delete_as_admin(&e.entry.key).await.unwrap();
    bounded(WAIT, "deletion seen", watching)
        .await
        .unwrap()
        .unwrap();
    bounded(
        Duration::from_secs(5),
        "gone already",
        a.wait_own_gone(&e.entry),
    )
    .await
    .unwrap();
    a.close().await.unwrap();
}
