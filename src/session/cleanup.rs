//! The deferred cleanup protocol: releases handed over by dropped guards and cancelled
//! acquisitions, carried out in order by the session's background task, so that a `Drop` never
//! blocks, never needs a runtime, and never leaves an entry behind.

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{debug, info_span, Instrument};

use super::handoff::Cleanup;
use super::shared::Shared;
use super::undo::Undo;
use crate::retry::{Backoff, Retry};
use crate::Error;

/// Carries out the handed-over work in order, retrying temporary errors until the session is
/// lost (then the cluster removes the entries with the session).
pub(crate) async fn worker(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Cleanup>) {
    let span = shared.span.clone();
    let remote = shared.remote.clone();
    let weak = Arc::downgrade(&shared);
    drop(shared);
    async move {
        while let Some(work) = rx.recv().await {
            let (undo, locals) = match work {
                Cleanup::Flush(tx) => {
                    let _ = tx.send(());
                    continue;
                }
                Cleanup::Undo { undo, locals } => (undo, locals),
            };
            let queues = undo.queues();
            let first = queues.first().map(ToString::to_string).unwrap_or_default();
            let span = info_span!("undo", queue = %first, queues = queues.len());
            let backoff = || weak.upgrade().map_or_else(Backoff::new, |s| s.backoff());
            let live = |e: &Error| {
                e.is_temporary()
                    && weak
                        .upgrade()
                        .is_some_and(|s| s.end().is_none() && !s.stop.is_cancelled())
            };
            // A session that ended takes its entries with it (its close, or the heartbeat task,
            // ends it on the cluster too): a request per queued release would only wait on a
            // cluster that may not answer, and hold up `flush` and the local slots behind it.
            let ended = weak.upgrade().is_none_or(|s| s.end().is_some());
            if !ended {
                let mut left = Some(undo);
                let done = Undo::carry_out(&mut left, &*remote, || Retry::new(backoff()), live)
                    .instrument(span)
                    .await;
                if let Err(e) = done {
                    debug!(error = %e, "background release given up (the session takes the entry with it)");
                }
            }
            drop(locals);
            if let Some(shared) = weak.upgrade() {
                for queue in &queues {
                    shared.local.trim(queue);
                }
            }
        }
    }
    .instrument(span)
    .await
}
