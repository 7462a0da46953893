//! The deferred cleanup protocol: releases handed over by dropped guards and cancelled
//! acquisitions, carried out in order by the session's background task, so that a `Drop` never
//! blocks, never needs a runtime, and never leaves an entry behind.

use std::sync::{Arc, Weak};

use tokio::sync::mpsc;
use tracing::{debug, info_span, Instrument};

use super::handoff::Cleanup;
use super::shared::Shared;
use crate::backend::EntryKind;
use crate::retry::Backoff;
use crate::Result;

/// Carries out the handed-over work in order, retrying temporary errors until the session is
/// lost (then the cluster removes the entries with the session).
pub(crate) async fn worker(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Cleanup>) {
    let span = shared.span.clone();
    let remote = shared.remote.clone();
    let weak = Arc::downgrade(&shared);
    drop(shared);
    async move {
        while let Some(work) = rx.recv().await {
            let (queue, local) = match work {
                Cleanup::Flush(tx) => {
                    let _ = tx.send(());
                    continue;
                }
                Cleanup::Remove {
                    queue,
                    entry,
                    local,
                } => {
                    let span = info_span!("release", key = %entry.key, token = %entry.token);
                    until_done(&weak, || remote.remove(&entry))
                        .instrument(span)
                        .await;
                    (queue, local)
                }
                Cleanup::Enqueued {
                    queue,
                    kind,
                    attempt,
                    inflight,
                    local,
                } => {
                    let span = info_span!("abandon", queue = %queue);
                    match inflight.await {
                        Ok(Ok(enqueued)) => {
                            until_done(&weak, || remote.remove(&enqueued.entry))
                                .instrument(span)
                                .await
                        }
                        _ => {
                            until_done(&weak, || remote.abandon(&queue, kind, attempt))
                                .instrument(span)
                                .await
                        }
                    }
                    (queue, local)
                }
                Cleanup::EnqueuedAll {
                    queues,
                    inflight,
                    maybe_created,
                    locals,
                } => {
                    let span = info_span!("abandon", queues = queues.len());
                    let created = match inflight {
                        Some(inflight) => inflight.await.ok(),
                        None => None,
                    };
                    async {
                        match created {
                            Some(Ok(Some(entries))) if !maybe_created => {
                                for entry in &entries {
                                    until_done(&weak, || remote.remove(entry)).await;
                                }
                            }
                            Some(Ok(None)) if !maybe_created => {}
                            _ => {
                                for (queue, attempt) in &queues {
                                    until_done(&weak, || {
                                        remote.abandon(queue, EntryKind::Exclusive, *attempt)
                                    })
                                    .await;
                                }
                            }
                        }
                    }
                    .instrument(span)
                    .await;
                    drop(locals);
                    if let Some(shared) = weak.upgrade() {
                        for (queue, _) in &queues {
                            shared.trim_local_queue(queue);
                        }
                    }
                    continue;
                }
                Cleanup::Abandon {
                    queue,
                    kind,
                    attempt,
                    local,
                } => {
                    let span = info_span!("abandon", queue = %queue);
                    until_done(&weak, || remote.abandon(&queue, kind, attempt))
                        .instrument(span)
                        .await;
                    (queue, local)
                }
            };
            drop(local);
            if let Some(shared) = weak.upgrade() {
                shared.trim_local_queue(&queue);
            }
        }
    }
    .instrument(span)
    .await
}

/// Runs `op` until it succeeds, a permanent error, or the session is gone.
async fn until_done<T, F, Fut>(weak: &Weak<Shared>, mut op: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut backoff = weak.upgrade().map_or_else(Backoff::new, |s| s.backoff());
    loop {
        match op().await {
            Ok(_) => return,
            Err(e) => {
                let gone = weak
                    .upgrade()
                    .is_none_or(|s| s.end().is_some() || s.stop.is_cancelled());
                if gone || !e.is_temporary() {
                    debug!(error = %e, "background release given up (the session takes the entry with it)");
                    return;
                }
                backoff.pause().await;
            }
        }
    }
}
