//! Bad input and misuse: typed errors, never a panic, never a leaked entry.

use std::time::Duration;

use super::{open, unique_namespace, Factory, TTL};
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
