//! Read-write locks: sharing, exclusion, FIFO fairness, tokens, cancellation.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::{bounded, open, unique_namespace, wait_entries, Factory, TTL, WAIT};
use crate::{EntryKind, Error};

/// Readers of two sessions hold together; a writer waits for both and its token exceeds
/// theirs; while it writes, nobody reads.
pub async fn readers_share_writer_excludes(f: &dyn Factory) {
    let ns = unique_namespace("readers_share");
    let (a, b, c) = (
        open(f, &ns, TTL).await,
        open(f, &ns, TTL).await,
        open(f, &ns, TTL).await,
    );
    let ra = bounded(WAIT, "read a", a.rwlock("doc").unwrap().read())
        .await
        .unwrap();
    let rb = bounded(WAIT, "read b", b.rwlock("doc").unwrap().read())
        .await
        .unwrap();
    assert_ne!(ra.token(), rb.token());
    let wc = c.rwlock("doc").unwrap();
    assert!(wc.try_write().await.unwrap().is_none(), "readers hold");
    let mut writer = tokio::spawn(async move { wc.write().await });
    wait_entries(&a, "writer queued", |l| l.len() == 3).await;
    ra.release().await.unwrap();
    // One reader left: the writer still waits, and a new reader queues behind the writer.
    assert!(a.rwlock("doc").unwrap().try_read().await.unwrap().is_none());
    let early = tokio::time::timeout(Duration::from_millis(100), &mut writer).await;
    assert!(early.is_err(), "a writer granted while b reads");
    rb.release().await.unwrap();
    let w = bounded(WAIT, "writer granted", writer)
        .await
        .unwrap()
        .unwrap();
    assert!(w.token() > ra.token() && w.token() > rb.token());
    assert!(a.rwlock("doc").unwrap().try_read().await.unwrap().is_none());
    assert!(b
        .rwlock("doc")
        .unwrap()
        .try_write()
        .await
        .unwrap()
        .is_none());
    w.release().await.unwrap();
    let r = a.rwlock("doc").unwrap().try_read().await.unwrap();
    assert!(r.is_some_and(|r| r.token() > w.token()));
    a.flush().await;
    for s in [&a, &b, &c] {
        s.close().await.unwrap();
    }
}

/// FIFO: a reader queued behind a waiting writer is granted after that writer, not with the
/// reader ahead of it (writers are never starved), and every grant's token is larger than
/// those of the grants it follows.
pub async fn queued_writer_holds_back_later_readers(f: &dyn Factory) {
    let ns = unique_namespace("writer_fifo");
    let (a, b, c) = (
        open(f, &ns, TTL).await,
        open(f, &ns, TTL).await,
        open(f, &ns, TTL).await,
    );
    let log = Arc::new(StdMutex::new(Vec::new()));
    let ra = a.rwlock("q").unwrap().read().await.unwrap();
    let (lw, lr) = (log.clone(), log.clone());
    let wb = b.rwlock("q").unwrap();
    let writer = tokio::spawn(async move {
        let w = wb.write().await.unwrap();
        lw.lock().unwrap().push(("write", w.token()));
        tokio::task::yield_now().await;
        lw.lock().unwrap().push(("write done", w.token()));
        w.release().await.unwrap();
    });
    wait_entries(&a, "writer queued", |l| l.len() == 2).await;
    let rc = c.rwlock("q").unwrap();
    let reader = tokio::spawn(async move {
        let r = rc.read().await.unwrap();
        lr.lock().unwrap().push(("read", r.token()));
        r.release().await.unwrap();
    });
    wait_entries(&a, "reader queued", |l| l.len() == 3).await;
    // The reader queued behind the writer may not join the reader that holds.
    assert!(
        log.lock().unwrap().is_empty(),
        "nobody granted while a reads"
    );
    ra.release().await.unwrap();
    bounded(WAIT, "writer", writer).await.unwrap();
    bounded(WAIT, "reader", reader).await.unwrap();
    let log = log.lock().unwrap().clone();
    let names: Vec<_> = log.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["write", "write done", "read"], "FIFO: {log:?}");
    assert!(log[0].1 > ra.token() && log[2].1 > log[0].1);
    for s in [&a, &b, &c] {
        s.close().await.unwrap();
    }
}

/// Within one session: tasks read together, a write waits for them (locally), and a waiting
/// write holds back later reads of the same session.
pub async fn rwlock_in_one_session(f: &dyn Factory) {
    let ns = unique_namespace("rw_one_session");
    let s = open(f, &ns, TTL).await;
    let l = s.rwlock("x").unwrap();
    let r1 = bounded(WAIT, "read 1", l.read()).await.unwrap();
    let r2 = bounded(WAIT, "read 2", l.read()).await.unwrap();
    assert_ne!(r1.token(), r2.token(), "one entry per read");
    assert!(l.try_write().await.unwrap().is_none());
    let e = l
        .write_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = bounded(WAIT, "write", l.write()).await.unwrap();
    assert!(l.try_read().await.unwrap().is_none());
    let again = w.reenter().unwrap();
    assert_eq!(again.token(), w.token());
    w.release().await.unwrap();
    assert!(again.is_held(), "reentrant: held until the last guard goes");
    again.release().await.unwrap();
    s.flush().await;
    assert!(s.list_entries().await.unwrap().is_empty());
    s.close().await.unwrap();
}

/// Cancelled and timed-out reads and writes leave no entry; `inspect` shows the holders, then
/// the waiters with their kinds.
pub async fn rwlock_cancel_and_inspect(f: &dyn Factory) {
    let ns = unique_namespace("rw_cancel");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    let w = a.rwlock("c").unwrap().write().await.unwrap();
    let lb = b.rwlock("c").unwrap();
    for i in 0..6u64 {
        let d = Duration::from_micros(i * i * 400);
        assert!(tokio::time::timeout(d, lb.read()).await.is_err());
        assert!(tokio::time::timeout(d, lb.write()).await.is_err());
    }
    let e = lb
        .read_timeout(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }));
    bounded(WAIT, "flush", b.flush()).await;
    assert_eq!(a.list_entries().await.unwrap(), vec![w.key().to_string()]);
    // Two queued readers: the holder first, then the waiters in order, with kinds.
    let c = open(f, &ns, TTL).await;
    let (l1, l2) = (b.rwlock("c").unwrap(), c.rwlock("c").unwrap());
    let t1 = tokio::spawn(async move { l1.read().await.map(|g| g.token()) });
    wait_entries(&a, "reader queued", |l| l.len() == 2).await;
    let t2 = tokio::spawn(async move { l2.read().await.map(|g| g.token()) });
    wait_entries(&a, "reader queued", |l| l.len() == 3).await;
    let (holders, waiters) = a.rwlock("c").unwrap().inspect().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].token, w.token());
    assert_eq!(holders[0].kind, EntryKind::Exclusive);
    assert_eq!(holders[0].session, a.id());
    let who: Vec<_> = waiters
        .iter()
        .map(|e| (e.session.clone(), e.kind))
        .collect();
    assert_eq!(
        who,
        [(b.id(), EntryKind::Shared), (c.id(), EntryKind::Shared)]
    );
    w.release().await.unwrap();
    // Both readers are granted together (their tasks drop the guards when done).
    bounded(WAIT, "reader 1", t1).await.unwrap().unwrap();
    bounded(WAIT, "reader 2", t2).await.unwrap().unwrap();
    for s in [&a, &b, &c] {
        s.flush().await;
    }
    assert!(a.list_entries().await.unwrap().is_empty());
    for s in [&a, &b, &c] {
        s.close().await.unwrap();
    }
}
