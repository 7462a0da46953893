//! [`Shared::close_once_lost`](super::shared::Shared::close_once_lost) against the heartbeat
//! task's mark at the local deadline, in both orders: whichever comes second closes the session
//! on the cluster, once, and before the cluster's own expiry. (The Supervisor's drop guard calls
//! it for a session started with `close_at_deadline(false)`.)

use std::time::Duration;

use tokio::time::Instant;

use crate::{MemoryBackend, Session, SessionEnd};

const TTL: Duration = Duration::from_secs(10);
const MARGIN: Duration = Duration::from_secs(5);

async fn unclosed_at_deadline(backend: &MemoryBackend) -> Session {
    Session::builder(backend.clone())
        .ttl(TTL)
        .safety_margin(MARGIN)
        .close_at_deadline(false)
        .start()
        .await
        .unwrap()
}

/// Waits until `backend` no longer has session `s`; panics if it still has it `within` after
/// `since`.
async fn gone_within(backend: &MemoryBackend, s: &Session, since: Instant, within: Duration) {
    while backend.session_alive(&s.id()) {
        assert!(
            since.elapsed() < within,
            "still on the cluster {:?} after the loss",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Turned on before the deadline: the heartbeat task, marking the loss, closes it itself.
#[tokio::test(start_paused = true)]
async fn turned_on_first_the_heartbeat_closes_at_the_deadline() {
    let backend = MemoryBackend::new();
    let s = unclosed_at_deadline(&backend).await;
    backend.hold_keep_alives();
    assert!(
        !s.shared().close_once_lost(),
        "not lost yet: nothing to close"
    );
    assert_eq!(s.lost().await, SessionEnd::LocalDeadline);
    let lost_at = Instant::now();
    // Well before the cluster's expiry, a margin later.
    gone_within(&backend, &s, lost_at, MARGIN / 2).await;
    assert!(!s
        .shared()
        .orphaned
        .load(std::sync::atomic::Ordering::SeqCst));
}

/// Turned on after the heartbeat task marked the loss and left the close to the owner: the
/// caller is told to close it, and its close does.
#[tokio::test(start_paused = true)]
async fn turned_on_after_the_mark_the_caller_closes() {
    let backend = MemoryBackend::new();
    let s = unclosed_at_deadline(&backend).await;
    backend.hold_keep_alives();
    assert_eq!(s.lost().await, SessionEnd::LocalDeadline);
    let lost_at = Instant::now();
    // Left for the owner: the heartbeat task does not close it.
    tokio::time::sleep(MARGIN / 4).await;
    assert!(backend.session_alive(&s.id()), "closed at the deadline");
    assert!(
        s.shared().close_once_lost(),
        "lost and unclosed: the caller's to close"
    );
    s.close().await.unwrap();
    gone_within(&backend, &s, lost_at, MARGIN / 2).await;
}
