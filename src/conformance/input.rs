//! Bad input and misuse: typed errors, never a panic, never a leaked entry.

use std::time::Duration;

use futures_util::StreamExt;

use super::{bounded, open, unique_namespace, wait_entries, Factory, TTL, WAIT};
use crate::{Error, LostReason, Session, SessionEnd};

/// Invalid names, namespaces and TTLs are refused with typed errors before anything is sent.
pub async fn bad_input(f: &dyn Factory) {
    let ns = unique_namespace("bad_input");
    let s = open(f, &ns, TTL).await;
    let long = "n".repeat(513);
    for bad in [
        "",
        "/lead",
        "trail/",
        "a//b",
        "nul\0",
        "a/../b",
        long.as_str(),
        // In a namespace (as `unique_namespace` makes), below its last segment.
        "read",
        "write",
    ] {
        assert!(
            matches!(s.mutex(bad), Err(Error::InvalidName(_))),
            "mutex {bad:?}"
        );
        assert!(
            matches!(s.election(bad), Err(Error::InvalidName(_))),
            "election {bad:?}"
        );
    }
    assert!(s.mutex(&"n".repeat(512)).is_ok());
    for ttl in [Duration::ZERO, f.backend().min_ttl() / 2] {
        let r = Session::builder(f.backend())
            .namespace(&ns)
            .ttl(ttl)
            .start()
            .await;
        assert!(matches!(r, Err(Error::InvalidTtl(_))), "ttl {ttl:?}: {r:?}");
    }
    let r = Session::builder(f.backend())
        .namespace(&ns)
        .ttl(TTL)
        .safety_margin(TTL)
        .start()
        .await;
    assert!(
        matches!(r, Err(Error::InvalidTtl(_))),
        "margin = ttl: {r:?}"
    );
    let r = Session::builder(f.backend())
        .namespace("a//b")
        .start()
        .await;
    assert!(matches!(r, Err(Error::InvalidName(_))), "namespace: {r:?}");
    assert!(
        s.list_entries().await.unwrap().is_empty(),
        "nothing created"
    );
    s.close().await.unwrap();
}

/// One name limit for every primitive: a name of exactly [`MAX_NAME_LEN`](crate::MAX_NAME_LEN)
/// bytes (ASCII, and two-byte characters) works end to end as a mutex, an election, a
/// read-write lock, a semaphore (whose queues on the cluster append `/locks` and `/leases` to
/// it) and in a multi-lock, and shows in [`Session::queues`]; one byte more is
/// [`Error::InvalidName`] from every constructor, before anything is sent.
pub async fn every_primitive_takes_every_valid_name(f: &dyn Factory) {
    let ns = unique_namespace("name_limit");
    let s = open(f, &ns, TTL).await;
    let max = crate::MAX_NAME_LEN;
    for name in ["n".repeat(max), "é".repeat(max / 2)] {
        assert_eq!(name.len(), max);
        let g = bounded(WAIT, "mutex", s.mutex(&name).unwrap().lock()).await;
        g.unwrap().release().await.unwrap();
        let l = bounded(WAIT, "election", s.election(&name).unwrap().campaign(b"v")).await;
        l.unwrap().resign().await.unwrap();
        let rw = s.rwlock(&name).unwrap();
        bounded(WAIT, "read", rw.read())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        bounded(WAIT, "write", rw.write())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let sem = s
            .semaphore(&name, 1)
            .unwrap_or_else(|e| panic!("semaphore of a {max}-byte name: {e:?}"));
        let p = bounded(WAIT, "semaphore", sem.acquire()).await.unwrap();
        let queues = bounded(WAIT, "queues", s.queues("")).await.unwrap();
        assert!(
            queues.iter().any(|q| q.name.starts_with(name.as_str())),
            "the semaphore's queue is listed"
        );
        p.release().await.unwrap();
        let ml = s.multi_lock([name.as_str(), "other"]).unwrap();
        let g = bounded(WAIT, "multi try_lock", ml.try_lock())
            .await
            .unwrap();
        g.expect("a free set").release().await.unwrap();
        let g = bounded(WAIT, "multi lock", ml.lock()).await.unwrap();
        g.release().await.unwrap();
    }
    let over = "n".repeat(max + 1);
    let refused = |what: &str, r: Option<Error>| match r {
        Some(Error::InvalidName(_)) => {}
        other => panic!("{what} of {} bytes: {other:?}", max + 1),
    };
    refused("mutex", s.mutex(&over).err());
    refused("election", s.election(&over).err());
    refused("rwlock", s.rwlock(&over).err());
    refused("semaphore", s.semaphore(&over, 1).err());
    refused("multi_lock", s.multi_lock([over.as_str(), "other"]).err());
    // Among more names than one atomic request takes, the bad name is what is reported.
    let many = (0..1_000).map(|i| format!("n{i}")).chain([over.clone()]);
    refused("multi_lock of many", s.multi_lock(many).err());
    s.flush().await;
    assert!(s.list_entries().await.unwrap().is_empty(), "nothing left");
    s.close().await.unwrap();
}

/// After `close()`, every operation fails with [`Error::SessionLost`] and closing again is
/// harmless; guards taken before report the loss ([`Error::NotHeld`] with the session's end).
pub async fn use_after_close(f: &dyn Factory) {
    let ns = unique_namespace("use_after_close");
    let s = open(f, &ns, TTL).await;
    let m = s.mutex("m").unwrap();
    let g = m.lock().await.unwrap();
    s.close().await.unwrap();
    s.close().await.unwrap();
    assert!(!g.is_held());
    assert!(matches!(
        g.release().await,
        Err(Error::NotHeld(LostReason::Session(SessionEnd::Closed)))
    ));
    assert!(matches!(m.lock().await, Err(Error::SessionLost(_))));
    assert!(matches!(m.try_lock().await, Err(Error::SessionLost(_))));
    assert!(matches!(
        m.lock_timeout(Duration::from_secs(1)).await,
        Err(Error::SessionLost(_))
    ));
    let e = s.election("e").unwrap();
    assert!(matches!(e.campaign(b"x").await, Err(Error::SessionLost(_))));
    let other = open(f, &ns, TTL).await;
    assert!(
        other.list_entries().await.unwrap().is_empty(),
        "nothing left"
    );
    other.close().await.unwrap();
}

/// `lock_timeout(Duration::ZERO)` behaves as `try_lock` with an error: a free lock is granted
/// (the first request is never cut off by the timeout), a held one gives [`Error::Timeout`] and
/// leaves no entry, every time.
pub async fn lock_timeout_zero_behaves_as_try_lock(f: &dyn Factory) {
    let ns = unique_namespace("lock_timeout_zero");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let (ma, mb) = (a.mutex("z").unwrap(), b.mutex("z").unwrap());
    for _ in 0..5 {
        let g = bounded(
            WAIT,
            "lock_timeout(0) on a free lock",
            ma.lock_timeout(Duration::ZERO),
        )
        .await
        .expect("a free lock is granted");
        let r = bounded(
            WAIT,
            "lock_timeout(0) on a held lock",
            mb.lock_timeout(Duration::ZERO),
        )
        .await;
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert_eq!(a.list_entries().await.unwrap(), vec![g.key().to_string()]);
        g.release().await.unwrap();
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Huge durations are refused with typed errors or saturate; none panics: a TTL or safety
/// margin of `Duration::MAX` (or `u64::MAX` seconds) is [`Error::InvalidTtl`], a zero margin
/// too; `lock_timeout(Duration::MAX)` and `start_timeout(Duration::MAX)` wait without a limit.
pub async fn huge_durations_never_panic(f: &dyn Factory) {
    let ns = unique_namespace("huge_durations");
    for ttl in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        Duration::from_secs(u64::MAX / 2),
    ] {
        let r = Session::builder(f.backend())
            .namespace(&ns)
            .ttl(ttl)
            .start()
            .await;
        assert!(matches!(r, Err(Error::InvalidTtl(_))), "ttl {ttl:?}: {r:?}");
    }
    // A margin past half the TTL: a deadline before the first heartbeat could be confirmed.
    for margin in [
        Duration::MAX,
        Duration::ZERO,
        TTL - Duration::from_nanos(1),
        TTL / 2 + Duration::from_millis(1),
    ] {
        let r = Session::builder(f.backend())
            .namespace(&ns)
            .ttl(TTL)
            .safety_margin(margin)
            .start()
            .await;
        assert!(
            matches!(r, Err(Error::InvalidTtl(_))),
            "margin {margin:?}: {r:?}"
        );
    }
    let s = bounded(
        WAIT,
        "start with a huge start timeout",
        Session::builder(f.backend())
            .namespace(&ns)
            .ttl(TTL)
            .start_timeout(Duration::MAX)
            .start(),
    )
    .await
    .unwrap();
    let m = s.mutex("h").unwrap();
    let g = bounded(WAIT, "lock_timeout(MAX)", m.lock_timeout(Duration::MAX))
        .await
        .unwrap();
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// A value longer than the backend's limit is refused with [`Error::InvalidValue`] before
/// anything is sent (campaign and proclaim), and leaves no entry; a value of exactly the limit
/// works and is read back whole. The revocation marker is refused as a value too.
pub async fn oversized_values_are_refused(f: &dyn Factory) {
    let ns = unique_namespace("oversized_values");
    let s = open(f, &ns, TTL).await;
    let max = crate::backend::MAX_VALUE_LEN;
    let e = s.election("big").unwrap();
    let r = bounded(
        WAIT,
        "campaign with a huge value",
        e.campaign(vec![7u8; max + 1]),
    )
    .await;
    assert!(matches!(r, Err(Error::InvalidValue(_))), "{r:?}");
    assert!(
        s.list_entries().await.unwrap().is_empty(),
        "nothing created"
    );
    let r = bounded(WAIT, "campaign with 3 MB", e.campaign(vec![7u8; 3_000_000])).await;
    assert!(matches!(r, Err(Error::InvalidValue(_))), "{r:?}");
    let l = bounded(
        WAIT,
        "campaign with the largest value",
        e.campaign(vec![1u8; max]),
    )
    .await
    .unwrap();
    let info = e.leader().await.unwrap().expect("a leader");
    assert_eq!(info.value.len(), max);
    let r = l.proclaim(vec![2u8; max + 1]).await;
    assert!(matches!(r, Err(Error::InvalidValue(_))), "{r:?}");
    assert!(l.is_leader(), "a refused proclaim changes nothing");
    l.proclaim(vec![3u8; max]).await.unwrap();
    assert_eq!(e.leader().await.unwrap().unwrap().value, vec![3u8; max]);
    // The revocation marker is no value of a leader's: it would take itself for revoked.
    let r = l.proclaim(crate::backend::REVOKE_MARKER).await;
    assert!(matches!(r, Err(Error::InvalidValue(_))), "{r:?}");
    assert!(l.is_leader(), "a refused proclaim changes nothing");
    l.resign().await.unwrap();
    let r = bounded(
        WAIT,
        "campaign with the revocation marker",
        e.campaign(crate::backend::REVOKE_MARKER),
    )
    .await;
    assert!(matches!(r, Err(Error::InvalidValue(_))), "{r:?}");
    s.close().await.unwrap();
}

/// Five candidates with values of the largest size: `leader()`, `observe()` and
/// `candidates()` still read them (a reply carrying every value would pass a client's reply
/// size limit, 4 MiB for gRPC).
pub async fn largest_values_of_many_candidates(f: &dyn Factory) {
    let ns = unique_namespace("largest_values");
    let max = crate::backend::MAX_VALUE_LEN;
    let mut sessions = Vec::new();
    let mut leader = None;
    let mut waiting = Vec::new();
    for i in 0..5u8 {
        let s = open(f, &ns, TTL).await;
        let e = s.election("big").unwrap();
        if i == 0 {
            let l = bounded(WAIT, "the first campaign", e.campaign(vec![i; max])).await;
            leader = Some(l.unwrap());
        } else {
            // Queued behind the first: left waiting (aborted at the end).
            waiting.push(tokio::spawn(async move {
                e.campaign(vec![i; max]).await.map(drop)
            }));
        }
        sessions.push(s);
    }
    let reader = &sessions[0];
    wait_entries(reader, "five candidates", |l| l.len() == 5).await;
    let e = reader.election("big").unwrap();
    let info = bounded(WAIT, "leader()", e.leader())
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(info.value, vec![0u8; max]);
    let mut observe = Box::pin(e.observe());
    let first = bounded(WAIT, "observe()", observe.next())
        .await
        .expect("an item")
        .unwrap()
        .expect("a leader");
    assert_eq!(first.value, vec![0u8; max]);
    let all = bounded(WAIT, "candidates()", e.candidates()).await.unwrap();
    assert_eq!(all.len(), 5);
    assert!(all.iter().all(|c| c.value.len() == max));
    for w in waiting {
        w.abort();
    }
    drop(leader);
    for s in sessions {
        s.close().await.unwrap();
    }
}

/// Odd Unicode names (emoji, characters beyond the Basic Multilingual Plane, right-to-left
/// text, combining marks, joiners, the replacement character, long multi-byte names) are either
/// refused by `mutex()` with [`Error::InvalidName`] or work end to end: never an untyped error
/// at `lock()`.
pub async fn odd_unicode_names(f: &dyn Factory) {
    let ns = unique_namespace("odd_unicode");
    let s = open(f, &ns, TTL).await;
    let long = "é".repeat(256); // 512 bytes
    for name in [
        "emoji-🔒",
        "cjk-ext-b-𠀀",
        "rtl-שלום",
        "combining-e\u{301}",
        "zwj-👩\u{200d}💻",
        "replacement-\u{fffd}",
        "nbsp\u{a0}name",
        long.as_str(),
    ] {
        match s.mutex(name) {
            Err(Error::InvalidName(_)) => {}
            Err(e) => panic!("{name:?}: an untyped refusal: {e:?}"),
            Ok(m) => {
                let g = bounded(WAIT, "lock an odd name", m.lock())
                    .await
                    .unwrap_or_else(|e| {
                        panic!("{name:?} accepted by mutex() but lock() failed: {e:?}")
                    });
                g.release().await.unwrap();
            }
        }
    }
    assert!(s.list_entries().await.unwrap().is_empty());
    s.close().await.unwrap();
}
