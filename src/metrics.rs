//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade: fencelock records, the
//! application picks the exporter (Prometheus, StatsD, …) by installing a recorder. Without a
//! recorder, recording costs a few atomic loads.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | [`ACQUISITIONS`] | counter | `primitive`, `outcome` | acquisitions ended: `granted`, `not_acquired` (a `try_*` that found it taken), `timeout`, `error` |
//! | [`HANDOFFS`] | counter | `primitive` | grants that had to wait for another holder to go |
//! | [`WAIT_SECONDS`] | histogram | `primitive` | time from the call to the grant |
//! | [`HOLD_SECONDS`] | histogram | `primitive` | time from the grant to the release (or the loss) |
//! | [`LOSSES`] | counter | `reason` | grants lost without a release: `entry_deleted`, `superseded`, and sessions lost (`expired`, `local_deadline`) |
//! | [`SESSIONS`] | gauge | `state` | open sessions by state: `live`, `suspended` |
//! | [`HEARTBEAT_SECONDS`] | histogram | `backend` | heartbeat round-trip time |
//! | [`RETRIES`] | counter | `backend` | requests retried after a temporary error |
//!
//! `primitive` is `mutex`, `election`, `read`, `write` or `semaphore`. Lock names are not labels
//! by default (thousands of locks would make thousands of series); with
//! [`SessionBuilder::metrics_lock_names`](crate::SessionBuilder::metrics_lock_names) the
//! acquisition metrics also carry a `name` label.
//!
//! `fencelock-examples`' `metrics` example exports them in Prometheus' text format.

use std::time::Duration;

use crate::backend::{EntryKind, QueueId, QueueKind};
use crate::{LostReason, SessionEnd, SessionState};

/// Counter: acquisitions ended, by `primitive` and `outcome`.
pub const ACQUISITIONS: &str = "fencelock_acquisitions_total";
/// Counter: grants that waited for a previous holder (a handoff), by `primitive`.
pub const HANDOFFS: &str = "fencelock_handoffs_total";
/// Histogram (seconds): from the acquisition call to the grant, by `primitive`.
pub const WAIT_SECONDS: &str = "fencelock_wait_seconds";
/// Histogram (seconds): from the grant to its end, by `primitive`.
pub const HOLD_SECONDS: &str = "fencelock_hold_seconds";
/// Counter: losses, by `reason`.
pub const LOSSES: &str = "fencelock_losses_total";
/// Gauge: open sessions, by `state`.
pub const SESSIONS: &str = "fencelock_sessions";
/// Histogram (seconds): heartbeat round trips, by `backend`.
pub const HEARTBEAT_SECONDS: &str = "fencelock_heartbeat_seconds";
/// Counter: retried requests, by `backend`.
pub const RETRIES: &str = "fencelock_retries_total";

/// The `primitive` label of an entry of `kind` in `queue`.
pub(crate) fn primitive(queue: &QueueId, kind: EntryKind) -> &'static str {
    match (queue.kind, kind) {
        (QueueKind::Election, _) => "election",
        (QueueKind::ReadWrite, EntryKind::Shared) => "read",
        (QueueKind::ReadWrite, _) => "write",
        (QueueKind::Semaphore, _) => "semaphore",
        _ => "mutex",
    }
}

/// The labels of an acquisition metric: the primitive, and the lock's name if asked for.
fn labels(primitive: &'static str, name: Option<&str>) -> Vec<metrics::Label> {
    // Room for the `outcome` that `acquisition` adds.
    let mut v = Vec::with_capacity(3);
    v.push(metrics::Label::new("primitive", primitive));
    if let Some(n) = name {
        v.push(metrics::Label::new("name", n.to_string()));
    }
    v
}

/// How an acquisition ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Granted { waited: bool, after: Duration },
    NotAcquired,
    Timeout,
    Error,
}

impl Outcome {
    /// How an acquisition that gave `res` ended (`waited`, and `started` for a grant).
    pub(crate) fn of<T>(
        res: &crate::Result<Option<T>>,
        waited: bool,
        started: tokio::time::Instant,
    ) -> Self {
        match res {
            Ok(Some(_)) => Outcome::Granted {
                waited,
                after: started.elapsed(),
            },
            Ok(None) => Outcome::NotAcquired,
            Err(crate::Error::Timeout { .. }) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        }
    }
}

/// Records the end of an acquisition.
pub(crate) fn acquisition(primitive: &'static str, name: Option<&str>, outcome: Outcome) {
    let l = labels(primitive, name);
    let tag = match outcome {
        Outcome::Granted { waited, after } => {
            metrics::histogram!(WAIT_SECONDS, l.clone()).record(after.as_secs_f64());
            if waited {
                metrics::counter!(HANDOFFS, l.clone()).increment(1);
            }
            "granted"
        }
        Outcome::NotAcquired => "not_acquired",
        Outcome::Timeout => "timeout",
        Outcome::Error => "error",
    };
    let mut l = l;
    l.push(metrics::Label::new("outcome", tag));
    metrics::counter!(ACQUISITIONS, l).increment(1);
}

/// Records the end of a tenure that lasted `held`.
pub(crate) fn tenure_ended(primitive: &'static str, name: Option<&str>, held: Duration) {
    metrics::histogram!(HOLD_SECONDS, labels(primitive, name)).record(held.as_secs_f64());
}

/// Records a grant lost without a release.
pub(crate) fn grant_lost(reason: LostReason) {
    match reason {
        LostReason::EntryDeleted => {
            metrics::counter!(LOSSES, "reason" => "entry_deleted").increment(1);
        }
        LostReason::Superseded => {
            metrics::counter!(LOSSES, "reason" => "superseded").increment(1);
        }
        _ => {}
    }
}

fn state_label(s: SessionState) -> Option<&'static str> {
    match s {
        SessionState::Live => Some("live"),
        SessionState::Suspended => Some("suspended"),
        SessionState::Lost(_) => None,
    }
}

/// Records a session's change of state (`old` `None`: a new session).
pub(crate) fn session_state(old: Option<SessionState>, new: SessionState) {
    if let Some(l) = old.and_then(state_label) {
        metrics::gauge!(SESSIONS, "state" => l).decrement(1.0);
    }
    if let Some(l) = state_label(new) {
        metrics::gauge!(SESSIONS, "state" => l).increment(1.0);
    }
    if let SessionState::Lost(end) = new {
        let reason = match end {
            SessionEnd::Expired => Some("expired"),
            SessionEnd::LocalDeadline => Some("local_deadline"),
            _ => None,
        };
        if let Some(r) = reason {
            metrics::counter!(LOSSES, "reason" => r).increment(1);
        }
    }
}

/// Records a confirmed heartbeat's round trip.
pub(crate) fn heartbeat(backend: &'static str, rtt: Duration) {
    metrics::histogram!(HEARTBEAT_SECONDS, "backend" => backend).record(rtt.as_secs_f64());
}

/// Records a request retried after a temporary error.
pub(crate) fn retried(backend: &'static str) {
    metrics::counter!(RETRIES, "backend" => backend).increment(1);
}
