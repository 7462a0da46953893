//! Multi-locks: all together, all or nothing, no deadlock.

use std::time::Duration;

use super::{bounded, open, unique_namespace, Factory, TTL, WAIT};
use crate::Error;

/// A multi-lock takes every lock (one token each) and releases them together.
pub async fn multi_lock_takes_all(f: &dyn Factory) {
    let ns = unique_namespace("multi_all");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    assert!(matches!(
        a.multi_lock(Vec::<&str>::new()).unwrap_err(),
        Error::InvalidConfig(_)
    ));
    let ml = a.multi_lock(["z", "x", "y", "x"]).unwrap();
    assert_eq!(ml.names(), ["x", "y", "z"], "sorted, deduplicated");
    let g = bounded(WAIT, "multi lock", ml.lock()).await.unwrap();
    assert_eq!(g.tokens().len(), 3);
    for n in ["x", "y", "z"] {
        assert!(b.mutex(n).unwrap().try_lock().await.unwrap().is_none());
        assert_eq!(
            b.mutex(n).unwrap().holder().await.unwrap().map(|h| h.token),
            g.token(n)
        );
    }
    g.release().await.unwrap();
    assert!(!g.is_held());
    let again = b.multi_lock(["x", "y", "z"]).unwrap().try_lock().await;
    let again = again.unwrap().expect("free after the release");
    assert!(again.token("x") > g.token("x"));
    again.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// `try_lock` of a set one of whose locks is held takes nothing and leaves nothing.
pub async fn multi_try_lock_is_all_or_nothing(f: &dyn Factory) {
    let ns = unique_namespace("multi_try");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    let held = b.mutex("n/2").unwrap().lock().await.unwrap();
    let ml = a.multi_lock(["n/1", "n/2", "n/3"]).unwrap();
    for _ in 0..3 {
        assert!(ml.try_lock().await.unwrap().is_none());
    }
    assert_eq!(
        a.list_entries().await.unwrap(),
        vec![held.key().to_string()]
    );
    // lock_timeout gives up having released what it took.
    let e = ml
        .lock_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert_eq!(
        a.list_entries().await.unwrap(),
        vec![held.key().to_string()]
    );
    held.release().await.unwrap();
    let g = ml.try_lock().await.unwrap().expect("all free");
    assert_eq!(g.tokens().len(), 3);
    g.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Two sessions locking overlapping sets named in opposite orders, 15 times each, never
/// deadlock (the canonical order).
pub async fn multi_locks_never_deadlock(f: &dyn Factory) {
    let ns = unique_namespace("multi_deadlock");
    let mut tasks = Vec::new();
    for names in [["p", "q", "r"], ["r", "q", "p"]] {
        let s = open(f, &ns, TTL).await;
        tasks.push(tokio::spawn(async move {
            let ml = s.multi_lock(names).unwrap();
            for _ in 0..15 {
                let g = ml.lock().await.unwrap();
                tokio::task::yield_now().await;
                g.release().await.unwrap();
            }
            s.close().await.unwrap();
        }));
    }
    for t in tasks {
        bounded(WAIT * 2, "no deadlock", t).await.unwrap();
    }
}

/// A multi-lock of as many names as the backend takes in one atomic request
/// ([`Backend::max_multi_lock`](crate::backend::Backend::max_multi_lock)) works: `try_lock` takes
/// them all, or nothing (and leaves nothing) when one is held, `lock_timeout` gives up leaving
/// nothing, `lock` takes them one by one. One name more is refused by `multi_lock()` with
/// [`Error::InvalidConfig`] before anything is sent (duplicates do not count).
pub async fn multi_lock_at_the_backend_limit(f: &dyn Factory) {
    let ns = unique_namespace("multi_limit");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    let max = f.backend().max_multi_lock();
    let names: Vec<String> = (0..max).map(|i| format!("n/{i:05}")).collect();
    let ml = a.multi_lock(&names).unwrap();
    let g = bounded(WAIT, "try_lock at the limit", ml.try_lock()).await;
    let g = g.unwrap().expect("every lock is free");
    assert_eq!(g.tokens().len(), max);
    bounded(WAIT, "release", g.release()).await.unwrap();
    let held = b.mutex(&names[max / 2]).unwrap().lock().await.unwrap();
    let r = bounded(WAIT, "try_lock with one held", ml.try_lock()).await;
    assert!(r.unwrap().is_none());
    let r = bounded(
        WAIT,
        "lock_timeout",
        ml.lock_timeout(Duration::from_millis(100)),
    )
    .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert_eq!(
        a.list_entries().await.unwrap(),
        vec![held.key().to_string()],
        "nothing left"
    );
    held.release().await.unwrap();
    let g = bounded(WAIT * 2, "lock at the limit", ml.lock())
        .await
        .unwrap();
    assert_eq!(g.tokens().len(), max);
    bounded(WAIT, "release", g.release()).await.unwrap();
    let mut dup = names.clone();
    dup.push(names[0].clone());
    assert!(a.multi_lock(&dup).is_ok(), "duplicates do not count");
    let over: Vec<String> = (0..=max).map(|i| format!("n/{i:05}")).collect();
    let r = a.multi_lock(&over);
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    assert!(a.list_entries().await.unwrap().is_empty());
    a.close().await.unwrap();
    b.close().await.unwrap();
}
