//! Session-wide behaviour: close, expiry, deletion by others, states.

use std::time::Duration;

use super::{bounded, open, unique_namespace, wait_entries, Factory, TTL, WAIT};
use crate::{Error, LostReason, SessionEnd, SessionState};

/// `close()` frees every lock of the session at once: a waiter on another session is granted,
/// and the closed session's guards report [`SessionEnd::Closed`].
pub async fn close_frees_everything(f: &dyn Factory) {
    let ns = unique_namespace("close_frees");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let mut guards = Vec::new();
    for name in ["x", "y", "z"] {
        guards.push(a.mutex(name).unwrap().lock().await.unwrap());
    }
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("y").unwrap().lock().await }
    });
    wait_entries(&b, "b queued", |l| l.len() == 4).await;
    let lost = guards[0].lost();
    a.close().await.unwrap();
    let gb = bounded(WAIT, "b granted after close", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(gb.token() > guards[1].token());
    assert_eq!(
        bounded(WAIT, "lost fires", lost).await,
        LostReason::Session(SessionEnd::Closed)
    );
    assert!(guards.iter().all(|g| !g.is_held()));
    assert!(matches!(a.state(), SessionState::Lost(SessionEnd::Closed)));
    let left = b.list_entries().await.unwrap();
    assert_eq!(left, vec![gb.key().to_string()], "only b's entry is left");
    b.close().await.unwrap();
}

/// A machine suspended past the local deadline (played with `Session::simulate_suspend`: the
/// clock that counts through suspend jumps ahead, the monotonic one does not): on resume the
/// session reports lost at once, no guard says it is held, and `lost()` fires within a
/// heartbeat period, before any new heartbeat could be mistaken for a confirmation.
pub async fn a_suspend_past_the_deadline_loses_every_lock(f: &dyn Factory) {
    let ns = unique_namespace("suspend");
    let a = open(f, &ns, TTL).await;
    let g = a.mutex("s").unwrap().lock().await.unwrap();
    // A short suspend (well inside the deadline) changes nothing.
    a.simulate_suspend(Duration::from_millis(1));
    assert!(g.is_held());
    assert!(!matches!(a.state(), SessionState::Lost(_)));
    let lost = g.lost();
    a.simulate_suspend(a.ttl());
    assert_eq!(a.state(), SessionState::Lost(SessionEnd::LocalDeadline));
    assert!(!g.is_held());
    assert_eq!(
        bounded(a.ttl(), "lost fires within a heartbeat period", lost).await,
        LostReason::Session(SessionEnd::LocalDeadline)
    );
    assert!(matches!(
        a.mutex("t").unwrap().try_lock().await,
        Err(Error::SessionLost(SessionEnd::LocalDeadline))
    ));
}

/// Deleting our entry from outside makes `lost()` fire with [`LostReason::EntryDeleted`], and
/// the next waiter is granted.
pub async fn entry_deleted_fires_lost(f: &dyn Factory) {
    let ns = unique_namespace("entry_deleted");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let ga = a.mutex("e").unwrap().lock().await.unwrap();
    let lost = ga.lost();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("e").unwrap().lock().await.map(|g| g.token()) }
    });
    wait_entries(&a, "b queued", |l| l.len() == 2).await;
    f.delete_as_admin(ga.key()).await.unwrap();
    assert_eq!(
        bounded(WAIT, "lost fires", lost).await,
        LostReason::EntryDeleted
    );
    assert!(!ga.is_held());
    let tb = bounded(WAIT, "b granted", waiter).await.unwrap().unwrap();
    assert!(tb > ga.token());
    assert!(matches!(
        ga.release().await,
        Err(Error::NotHeld(LostReason::EntryDeleted))
    ));
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A waiter whose entry an operator deletes, while the holder ahead of it holds on, learns it
/// within two of its TTLs with `EntryVanished` (it watches only the entry ahead, and looks at
/// its own now and then; on etcd and ZooKeeper it waited as long as the holder held).
pub async fn a_waiter_learns_its_entry_was_deleted(f: &dyn Factory) {
    let ns = unique_namespace("waiter_entry_deleted");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, f.short_ttl()).await;
    let held = bounded(WAIT, "lock", a.mutex("m").unwrap().lock())
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("m").unwrap().lock().await.map(drop) }
    });
    let list = wait_entries(&a, "the waiter queues", |l| l.len() == 2).await;
    let waiting = list.into_iter().find(|k| k != held.key()).unwrap();
    f.delete_as_admin(&waiting).await.unwrap();
    let r = bounded(
        f.short_ttl() * 2,
        "the waiter learns its entry was deleted",
        waiter,
    )
    .await
    .unwrap();
    assert!(matches!(r, Err(Error::EntryVanished { .. })), "{r:?}");
    assert!(held.is_held());
    held.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A leadership and a lock whose entries were deleted from outside, still alive (not yet
/// dropped), do not hold up the session's next campaign or lock of the same name: it used to
/// wait behind the lost one's place in the session's local queue, for as long as that was
/// kept (`leader = election.campaign(..).await?` keeps the old one while the new one waits).
/// The new grants' tokens are greater.
pub async fn requeue_after_entry_deleted(f: &dyn Factory) {
    let ns = unique_namespace("requeue_deleted");
    let a = open(f, &ns, TTL).await;
    let election = a.election("e").unwrap();
    let old = election.campaign(b"old").await.unwrap();
    f.delete_as_admin(old.key()).await.unwrap();
    assert_eq!(
        bounded(WAIT, "lost fires", old.lost()).await,
        LostReason::EntryDeleted
    );
    let new = bounded(WAIT, "campaign again", election.campaign(b"new"))
        .await
        .unwrap();
    assert!(new.epoch() > old.epoch());
    let m = a.mutex("m").unwrap();
    let held = m.lock().await.unwrap();
    f.delete_as_admin(held.key()).await.unwrap();
    assert_eq!(
        bounded(WAIT, "lost fires", held.lost()).await,
        LostReason::EntryDeleted
    );
    let again = bounded(WAIT, "try_lock", m.try_lock())
        .await
        .unwrap()
        .expect("free");
    assert!(again.token() > held.token());
    drop((old, held));
    new.resign().await.unwrap();
    again.release().await.unwrap();
    a.flush().await;
    assert!(a.list_entries().await.unwrap().is_empty(), "nothing left");
    a.close().await.unwrap();
}

/// Given-up `lost()` and `revoke_requested()` futures leave no task behind: 500 of each,
/// dropped after 1 ms on one held guard, leave the runtime's live task count where it was
/// (the ZooKeeper backend once kept a task, and a server watch, per dropped future until the
/// lock was released). The guard's `lost()` still fires on a deletion afterwards.
pub async fn dropped_loss_watches_leave_no_task(f: &dyn Factory) {
    use tokio::time::{timeout, Instant};
    let ns = unique_namespace("dropped_lost");
    let a = open(f, &ns, TTL).await;
    let g = a.mutex("w").unwrap().lock().await.unwrap();
    // Whatever the first watch of a session starts once (a watch stream) is not per future.
    let _ = timeout(Duration::from_millis(100), g.lost()).await;
    let _ = timeout(Duration::from_millis(100), g.revoke_requested()).await;
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    const ROUNDS: usize = 500;
    for _ in 0..ROUNDS {
        let _ = timeout(Duration::from_millis(1), g.lost()).await;
        let _ = timeout(Duration::from_millis(1), g.revoke_requested()).await;
    }
    // A few tasks of the session (its heartbeat, a request in flight) come and go: allow some,
    // far fewer than one per future.
    const SLACK: usize = 10;
    let start = Instant::now();
    loop {
        let now = tasks();
        if now <= before + SLACK {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{ROUNDS} dropped lost() and revoke_requested() left {} tasks (before: {before})",
            now
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(g.is_held());
    let lost = g.lost();
    f.delete_as_admin(g.key()).await.unwrap();
    assert_eq!(
        bounded(WAIT, "lost fires after the drops", lost).await,
        LostReason::EntryDeleted
    );
    a.close().await.unwrap();
}

/// A waiter whose session is lost fails with [`Error::SessionLost`] instead of waiting
/// forever, and its entry goes.
pub async fn waiter_fails_when_session_lost(f: &dyn Factory) {
    let ns = unique_namespace("waiter_lost");
    let ttl = f.short_ttl();
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, ttl).await;
    let ga = a.mutex("w").unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("w").unwrap().lock().await.map(|g| g.token()) }
    });
    wait_entries(&a, "b queued", |l| l.len() == 2).await;
    b.halt_heartbeats();
    let r = bounded(ttl * 2 + WAIT, "waiter fails", waiter)
        .await
        .unwrap();
    assert!(matches!(r, Err(Error::SessionLost(_))), "{r:?}");
    // The cluster expires b: its entry goes.
    wait_entries(&a, "b's entry expired", |l| l.len() == 1).await;
    assert!(ga.is_held());
    ga.release().await.unwrap();
    a.close().await.unwrap();
}

/// A session is live after start, reports its TTL and margin, goes lost at its local deadline
/// without heartbeats, and a lost session refuses new work.
pub async fn session_states(f: &dyn Factory) {
    let ns = unique_namespace("session_states");
    let ttl = f.short_ttl();
    let s = open(f, &ns, ttl).await;
    assert_eq!(s.state(), SessionState::Live);
    assert!(s.ttl() >= ttl && s.safety_margin() < s.ttl());
    let start = tokio::time::Instant::now();
    assert!(s.deadline() > start && s.deadline() <= start + s.ttl());
    // Heartbeats extend the deadline past the first TTL.
    tokio::time::sleep(s.ttl() + Duration::from_millis(200)).await;
    assert_eq!(s.state(), SessionState::Live, "heartbeats keep it live");
    let g = s.mutex("k").unwrap().lock().await.unwrap();
    s.halt_heartbeats();
    let reason = bounded(s.ttl() + WAIT, "session lost", s.lost()).await;
    assert!(
        matches!(reason, SessionEnd::LocalDeadline | SessionEnd::Expired),
        "{reason}"
    );
    assert!(!g.is_held());
    let m = s.mutex("k2").unwrap();
    assert!(matches!(m.lock().await, Err(Error::SessionLost(_))));
    assert!(matches!(m.try_lock().await, Err(Error::SessionLost(_))));
}

/// Guards and leaderships used after they were lost give typed errors, never a panic, and
/// leave no entry once the cluster expired the session.
pub async fn use_after_lost(f: &dyn Factory) {
    let ns = unique_namespace("use_after_lost");
    let ttl = f.short_ttl();
    let a = open(f, &ns, ttl).await;
    let g = a.mutex("m").unwrap().lock().await.unwrap();
    let l = a.election("e").unwrap().campaign(b"v").await.unwrap();
    a.halt_heartbeats();
    bounded(ttl + WAIT, "guard lost", g.lost()).await;
    bounded(WAIT, "leadership lost", l.lost()).await;
    assert!(!g.is_held() && !l.is_leader());
    let session_ended =
        |r: &Result<(), Error>| matches!(r, Err(Error::NotHeld(LostReason::Session(_))));
    assert!(session_ended(&g.release().await));
    assert!(matches!(
        g.release().await,
        Err(Error::NotHeld(LostReason::Released))
    ));
    assert!(session_ended(&l.proclaim(b"w").await));
    assert!(session_ended(&l.resign().await));
    assert!(matches!(
        a.mutex("m").unwrap().lock().await,
        Err(Error::SessionLost(_))
    ));
    drop((g, l));
    // The cluster expires the session: nothing is left.
    let b = open(f, &ns, TTL).await;
    wait_entries(&b, "expired entries gone", |l| l.is_empty()).await;
    b.close().await.unwrap();
}

/// `state_changes()` reports the current state first, then the end, and then ends.
pub async fn state_changes_until_closed(f: &dyn Factory) {
    use futures_util::StreamExt;
    let ns = unique_namespace("state_changes");
    let s = open(f, &ns, TTL).await;
    let states = s.state_changes();
    tokio::pin!(states);
    assert_eq!(
        bounded(WAIT, "first state", states.next()).await,
        Some(SessionState::Live)
    );
    s.close().await.unwrap();
    assert_eq!(
        bounded(WAIT, "the end", states.next()).await,
        Some(SessionState::Lost(SessionEnd::Closed))
    );
    assert_eq!(bounded(WAIT, "no more", states.next()).await, None);
}
