//! The create-and-wait loop of one acquisition: the entry created (retried, each try a request
//! in flight of its own), then the waits for the entries ahead that the grant rule depends on.

use std::sync::Arc;

use tracing::{info_span, Instrument};

use super::pending::{create, Pending};
use super::{Request, Wait};
use crate::backend::{EnqueueRequest, Enqueued, Entry, Peer};
use crate::session::{in_flight, Shared};
use crate::Result;

/// Creates the remote entry (retrying temporary errors), each try a request in flight of its
/// own (see [`InFlight`](crate::session::InFlight)).
pub(super) async fn enqueue(
    shared: &Arc<Shared>,
    req: Request<'_>,
    pending: &mut Pending,
    wait: Wait,
) -> Result<Enqueued> {
    let pending_attempt = pending.attempt;
    let created = create(
        shared,
        &mut pending.inflight,
        &mut pending.maybe_created,
        wait.deadline(),
        "enqueue",
        |retry| {
            let remote = shared.remote.clone();
            let (queue, kind, attempt) = (req.queue.clone(), req.kind, pending_attempt);
            let rule = req.rule;
            let value = req.value.to_vec();
            in_flight(async move {
                let (ahead_kind, nearest) = rule.window();
                let mut r = EnqueueRequest::new(&queue, kind, attempt, &value)
                    .with_ahead(ahead_kind, nearest);
                if retry {
                    r = r.retried();
                }
                remote.enqueue(r).await
            })
        },
    )
    .await;
    // A temporary error is returned only when the deadline came first.
    created.map_err(|e| {
        if e.is_temporary() {
            wait.timed_out()
        } else {
            e
        }
    })
}

/// One acquisition's entry on its way to the grant.
pub(super) struct Attempt<'a> {
    /// The session.
    pub(super) shared: &'a Shared,
    /// What is acquired, and by which rule.
    pub(super) req: Request<'a>,
    /// The entry created for it.
    pub(super) own: &'a Entry,
    /// How long it may wait.
    pub(super) wait: Wait,
}

impl Attempt<'_> {
    /// Waits until the rule grants the entry in its queue: waits for the entries `ahead` it
    /// depends on, and each time one goes, asks the cluster which are still there (one
    /// request, which also confirms the entry). Sets `waited` if it had to wait; returns
    /// `false` only for [`Wait::No`] when it would have to.
    pub(super) async fn turn(&self, mut ahead: Vec<Peer>, waited: &mut bool) -> Result<bool> {
        let Attempt {
            shared,
            req,
            own,
            wait,
        } = *self;
        let (queue, rule) = (req.queue, req.rule);
        let remote = shared.remote.clone();
        let (kind, nearest) = rule.window();
        loop {
            let targets = rule.targets(&ahead);
            if targets.is_empty() {
                return Ok(true);
            }
            if matches!(wait, Wait::No) {
                return Ok(false);
            }
            *waited = true;
            if let [i] = targets[..] {
                let target = &ahead[i];
                let span = info_span!("wait", on = %target.key, token = %own.token);
                shared
                    .retry(|| remote.wait(own, target))
                    .instrument(span)
                    .await?;
            } else {
                // Any of several may go first (a semaphore's holders): wait for them all at once.
                let span = info_span!("wait", on = targets.len(), token = %own.token);
                let waits = targets.iter().map(|&i| {
                    let (remote, target) = (remote.clone(), &ahead[i]);
                    Box::pin(async move { shared.retry(|| remote.wait(own, target)).await })
                });
                let (res, _, _) = futures_util::future::select_all(waits)
                    .instrument(span)
                    .await;
                res?;
            }
            ahead = shared
                .retry(|| remote.still_ahead(own, queue, kind, nearest))
                .await?;
        }
    }
}
