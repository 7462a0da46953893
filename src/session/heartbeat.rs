//! The heartbeat: one keep-alive every period (a third of the TTL, or what the backend asks
//! for, shorter) for every lock of the session, the local
//! deadline counted from the *send* time of the last confirmed heartbeat, and the session events
//! the backend pushes.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Duration;

use tokio::time::{sleep_until, timeout_at, Instant};

use crate::race::{race, First};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn, Instrument};

use super::shared::Shared;
use super::state::{SessionEnd, SessionState};
use crate::backend::{BackendSession, SessionEvent};
use crate::retry::{Backoff, Retry};
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
/// ends it (after closing the session on the cluster: whatever the loop was doing then, a
/// heartbeat in flight included, and even before its first turn).
pub(crate) async fn run(
    weak: Weak<Shared>,
    stop: CancellationToken,
    remote: Arc<dyn BackendSession>,
    _orphaned: Orphaned,
) {
    let ttl = remote.ttl();
    let Some(shared) = weak.upgrade() else {
        return close_patiently(&*remote, ttl).await;
    };
    let span = shared.span.clone();
    let margin = shared.margin;
    let period = remote.heartbeat_interval().min(ttl / 3);
    // The first beat a period after the send the deadline rests on (the open's), not a period
    // after now: an open that took a while (a slow link) put it past the deadline, and the
    // session was lost without a heartbeat.
    let now = Instant::now();
    let mut next = shared
        .deadline()
        .checked_sub(ttl.saturating_sub(margin))
        .map_or(now, |sent| sent + period)
        .min(now + period);
    // A failed heartbeat is one event of this loop among others: the driver gives the pause
    // before the next one (never retiring: the deadline ends the loop) and counts it.
    let mut retry = Retry::new(Backoff::for_ttl(ttl)).counted(shared.backend_name());
    drop(shared);
    // Whether a refused heartbeat was warned of since the last one that passed.
    let mut refusal_warned = false;
    async move {
        loop {
            let Some(shared) = weak.upgrade() else {
                return close_patiently(&*remote, ttl).await;
            };
            let deadline_at = shared.deadline_stamp();
            let deadline = deadline_at.mono;
            let halted = shared.halted.load(Ordering::SeqCst);
            // Past the deadline on the clock that counts through suspend, though Tokio's timer
            // has not fired (the machine slept): declared at once.
            let slept_past = shared.clock.passed(deadline_at);
            drop(shared);
            let wake = if slept_past {
                Wake::Deadline
            } else {
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
                    close_patiently(&*remote, ttl).await;
                    return;
                }
                Wake::Deadline => {
                    let mut close = !halted;
                    if let Some(shared) = weak.upgrade() {
                        if shared.close_at_deadline.load(Ordering::SeqCst) || halted {
                            shared.set_lost(SessionEnd::LocalDeadline);
                        } else {
                            close = false;
                            if shared.set_lost_unclosed(SessionEnd::LocalDeadline) {
                                if shared.close_at_deadline.load(Ordering::SeqCst) {
                                    // Turned on meanwhile (`close_once_lost`): closed here,
                                    // unless its caller took the close.
                                    close = shared.orphaned.swap(false, Ordering::SeqCst);
                                } else {
                                    drop(shared);
                                    // Left to the owner's close, which takes the mark; closed
                                    // here if the last handle goes first.
                                    stop.cancelled().await;
                                    close = weak.upgrade().is_none_or(|s| {
                                        s.orphaned.swap(false, Ordering::SeqCst)
                                    });
                                }
                            }
                        }
                    }
                    // Free our entries now rather than at the cluster's expiry — unless the
                    // heartbeats were halted to play a paused process, which sends nothing,
                    // or the owner closed the session once it stopped what the locks guard.
                    if close {
                        close_patiently(&*remote, ttl).await;
                    }
                    return;
                }
                Wake::Event(ev) => {
                    let Some(shared) = weak.upgrade() else {
                        return close_patiently(&*remote, ttl).await;
                    };
                    match ev {
                        SessionEvent::Expired => {
                            shared.set_lost(SessionEnd::Expired);
                            return;
                        }
                        SessionEvent::Disconnected => {
                            shared.set_state(SessionState::Suspended);
                            // Confirm (or find the session lost) without waiting a period;
                            // never later than the beat already due: a stream of these (a link
                            // that keeps resetting streams) must not put the beats off until
                            // the deadline.
                            next = next.min(Instant::now() + pause(&mut retry, &"the connection broke"));
                        }
                        // Confirm with a heartbeat right away.
                        SessionEvent::Reconnected => next = Instant::now(),
                    }
                }
                Wake::Beat => {
                    if weak.upgrade().is_none_or(|s| {
                        s.halted.load(Ordering::SeqCst) || s.clock.passed(deadline_at)
                    }) {
                        // Halted; or past the deadline (the loop's top declares it).
                        continue;
                    }
                    let Some(clock_of) = weak.upgrade() else {
                        return close_patiently(&*remote, ttl).await;
                    };
                    let sent = clock_of.clock.now();
                    drop(clock_of);
                    // A heartbeat unanswered for a period is a failed one: the session is
                    // suspended at once, not when the deadline comes.
                    let patience = deadline.min(sent.mono + ttl / 3);
                    let beat = timeout_at(patience, remote.keep_alive());
                    // A session closed or dropped meanwhile is ended now: the heartbeat in
                    // flight is moot, and waiting for it (up to a third of the TTL) would leave
                    // the session's locks held on the cluster that long.
                    // (`race`, not `tokio::select!`: the crate does not ask for Tokio's macros.)
                    let outcome = match race(stop.cancelled(), beat).await {
                        First::Left(()) => {
                            if let Some(shared) = weak.upgrade() {
                                shared.set_lost(SessionEnd::Closed);
                            }
                            return close_patiently(&*remote, ttl).await;
                        }
                        First::Right(outcome) => outcome,
                    };
                    match outcome {
                        Ok(Ok(())) => {
                            let Some(shared) = weak.upgrade() else {
                                return close_patiently(&*remote, ttl).await;
                            };
                            crate::metrics::heartbeat(shared.backend_name(), sent.mono.elapsed());
                            // A reply that comes after the deadline in force (the process
                            // was paused or the machine suspended in between) confirms
                            // nothing: the session is lost already (its `state()` says so),
                            // and the deadline branch declares it next. Lost is terminal:
                            // never extended, never "resumed".
                            let extended = sent.after(ttl - margin);
                            // Checked and moved under the deadline's lock, which `state()`
                            // reads it under too: no reader sees the old deadline passed
                            // and then the new one ahead (lost, then live again).
                            let mut deadline = shared.deadline.lock().unwrap();
                            let live = !shared.clock.passed(deadline_at.min(extended));
                            if live {
                                *deadline = extended;
                            }
                            drop(deadline);
                            if live {
                                shared.set_state(SessionState::Live);
                            }
                            retry.succeeded();
                            refusal_warned = false;
                            next = sent.mono + period;
                        }
                        Ok(Err(Error::SessionLost(reason))) => {
                            if let Some(shared) = weak.upgrade() {
                                shared.set_lost(reason);
                            }
                            return;
                        }
                        Ok(Err(e)) => {
                            // Retried all the same (the deadline ends the session), but one
                            // that cannot pass by waiting (credentials or permissions revoked)
                            // is what the operator needs to see when the session is lost.
                            // Warned of once until a heartbeat passes again (retried up to
                            // tens of times before the deadline).
                            if e.is_temporary() || refusal_warned {
                                debug!(error = %e, "heartbeat failed");
                            } else {
                                refusal_warned = true;
                                warn!(error = %e, "heartbeat refused: the session will be lost at its deadline unless this passes");
                            }
                            if let Some(shared) = weak.upgrade() {
                                shared.set_state(SessionState::Suspended);
                            }
                            next = Instant::now() + pause(&mut retry, &e);
                        }
                        // Unanswered: suspended, and tried again at once (the deadline, if it
                        // passed meanwhile, declares the session lost first).
                        Err(_) => {
                            debug!("heartbeat unanswered");
                            if let Some(shared) = weak.upgrade() {
                                shared.set_state(SessionState::Suspended);
                            }
                            next = Instant::now();
                        }
                    }
                }
            }
        }
    }
    .instrument(span)
    .await
}

/// Ends the session (as closed) when the heartbeat task goes, whatever way: dropped unfinished
/// when its runtime shuts down (a test's runtime, with the session kept elsewhere), nothing
/// heartbeats the session any more, and it must not look live until its deadline. (When the
/// task ends by itself, the session has ended already: the first reason stays.) An argument
/// of [`run`], so that it goes with the task even if the task never ran.
pub(crate) struct Orphaned(pub(crate) Weak<Shared>);

impl Drop for Orphaned {
    fn drop(&mut self) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        if matches!(*shared.state.borrow(), SessionState::Lost(_)) {
            return;
        }
        // The deadline, if it passed already, is the first reason.
        let reason = if shared.clock.passed(shared.deadline_stamp()) {
            SessionEnd::LocalDeadline
        } else {
            SessionEnd::Closed
        };
        shared.orphaned.store(true, Ordering::SeqCst);
        shared.set_lost(reason);
    }
}

/// The pause before the next heartbeat after a failed one: every failure is worth another try
/// (the local deadline, not the error, ends the session).
fn pause(retry: &mut Retry, why: &dyn std::fmt::Display) -> Duration {
    // Always `Some`: no give-up instant is set and every error is accepted.
    retry.after_failure(&why, |_| true).unwrap_or_default()
}

/// How long the background task keeps trying to end a lost or closed session on the cluster.
const CLOSE_PATIENCE: Duration = Duration::from_secs(3600);

/// The longest pause between two tries to end the session (a twentieth of the TTL if less):
/// once the cluster answers again, the session's locks are freed within about this long.
const CLOSE_RETRY_MAX: Duration = Duration::from_millis(250);

/// Ends the session on the cluster, retrying temporary errors (the cluster unreachable) with
/// backoff for up to [`CLOSE_PATIENCE`]. A cluster that comes back after an outage may revive
/// the session (etcd grants every lease a fresh TTL under a new leader); ending it as soon as
/// the cluster answers frees its locks at once instead of a TTL later.
pub(super) async fn close_patiently(remote: &dyn BackendSession, ttl: Duration) {
    let closed = Retry::new(Backoff::capped(CLOSE_RETRY_MAX.min(ttl / 20)))
        .until(Instant::now() + CLOSE_PATIENCE)
        .run(|| remote.close(), Error::is_temporary)
        .await;
    if let Err(e) = closed {
        warn!(error = %e, "cannot end the session on the cluster: it ends when the cluster expires it");
    }
}
