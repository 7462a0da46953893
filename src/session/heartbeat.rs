//! The heartbeat: one keep-alive every `ttl / 3` for every lock of the session, the local
//! deadline counted from the *send* time of the last confirmed heartbeat, and the session events
//! the backend pushes.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::task::Poll;

use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, Instrument};

use super::shared::Shared;
use super::state::{SessionEnd, SessionState};
use crate::backend::SessionEvent;
use crate::retry::Backoff;
use crate::Error;

/// What woke the heartbeat loop.
enum Wake {
    /// The session was closed or its last handle dropped.
    Stop,
    /// The local deadline passed without a confirmed heartbeat.
    Deadline,
    /// The backend pushed a session event.
    Event(SessionEvent),
    /// The next heartbeat is due.
    Beat,
}

/// Runs until the session ends. Holds only a weak reference, so that dropping the last handle
/// ends it (after closing the session on the cluster).
pub(crate) async fn run(weak: Weak<Shared>, stop: CancellationToken) {
    let Some(shared) = weak.upgrade() else { return };
    let span = shared.span.clone();
    let remote = shared.remote.clone();
    let ttl = shared.ttl;
    let margin = shared.margin;
    drop(shared);
    let mut next = Instant::now() + ttl / 3;
    let mut backoff = Backoff::new();
    async move {
        loop {
            let Some(shared) = weak.upgrade() else { return };
            let deadline = shared.deadline();
            let halted = shared.halted.load(Ordering::SeqCst);
            drop(shared);
            let wake = {
                let mut stopped = pin!(stop.cancelled());
                let mut deadline_passed = pin!(sleep_until(deadline));
                let mut event = pin!(remote.next_event());
                let mut beat_due = pin!(sleep_until(next));
                // In this order of precedence.
                poll_fn(|cx| {
                    if stopped.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Wake::Stop);
                    }
                    if deadline_passed.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Wake::Deadline);
                    }
                    if let Poll::Ready(ev) = event.as_mut().poll(cx) {
                        return Poll::Ready(Wake::Event(ev));
                    }
                    if !halted && beat_due.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Wake::Beat);
                    }
                    Poll::Pending
                })
                .await
            };
            match wake {
                Wake::Stop => {
                    if let Some(shared) = weak.upgrade() {
                        shared.set_lost(SessionEnd::Closed);
                    }
                    // Best effort: free every entry now rather than after the TTL.
                    let _ = tokio::time::timeout(ttl, remote.close()).await;
                    return;
                }
                Wake::Deadline => {
                    if let Some(shared) = weak.upgrade() {
                        shared.set_lost(SessionEnd::LocalDeadline);
                    }
                    // Free our entries now rather than at the cluster's expiry — unless the
                    // heartbeats were halted to play a paused process, which sends nothing.
                    if !halted {
                        let _ = tokio::time::timeout(ttl, remote.close()).await;
                    }
                    return;
                }
                Wake::Event(ev) => {
                    let Some(shared) = weak.upgrade() else { return };
                    match ev {
                        SessionEvent::Expired => {
                            shared.set_lost(SessionEnd::Expired);
                            return;
                        }
                        SessionEvent::Disconnected => shared.set_state(SessionState::Suspended),
                        // Confirm with a heartbeat right away.
                        SessionEvent::Reconnected => next = Instant::now(),
                    }
                }
                Wake::Beat => {
                    if weak
                        .upgrade()
                        .is_none_or(|s| s.halted.load(Ordering::SeqCst))
                    {
                        continue;
                    }
                    let sent = Instant::now();
                    match timeout_at(deadline, remote.keep_alive()).await {
                        Ok(Ok(())) => {
                            let Some(shared) = weak.upgrade() else { return };
                            *shared.deadline.lock().unwrap() = sent + (ttl - margin);
                            shared.set_state(SessionState::Live);
                            backoff = Backoff::new();
                            next = sent + ttl / 3;
                        }
                        Ok(Err(Error::SessionLost(reason))) => {
                            if let Some(shared) = weak.upgrade() {
                                shared.set_lost(reason);
                            }
                            return;
                        }
                        Ok(Err(e)) => {
                            debug!(error = %e, "heartbeat failed");
                            if let Some(shared) = weak.upgrade() {
                                shared.set_state(SessionState::Suspended);
                            }
                            next = Instant::now() + backoff.next_delay();
                        }
                        // The deadline passed while the heartbeat was in flight: the next turn
                        // of the loop declares the session lost.
                        Err(_) => next = Instant::now(),
                    }
                }
            }
        }
    }
    .instrument(span)
    .await
}
