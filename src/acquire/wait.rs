//! The create-and-wait loop of one acquisition: the entry created (retried as a task of its
//! own per try), then the waits for the entries ahead that the grant rule depends on.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::{debug, info_span, Instrument};

use super::pending::{answer_of, Pending};
use super::{Request, Wait};
use crate::backend::{EnqueueRequest, Enqueued, Entry, Peer};
use crate::session::Shared;
use crate::{Error, Result};

/// Creates the remote entry (retrying temporary errors), as a task of its own per try.
pub(super) async fn enqueue(
    shared: &Arc<Shared>,
    req: Request<'_>,
    pending: &mut Pending,
    wait: Wait,
) -> Result<Enqueued> {
    let mut backoff = shared.backoff();
    loop {
        shared.check_alive()?;
        let task = tokio::spawn({
            let remote = shared.remote.clone();
            let (queue, kind, attempt) = (req.queue.clone(), req.kind, pending.attempt);
            let rule = req.rule;
            let value = req.value.to_vec();
            let retry = pending.maybe_created;
            async move {
                let (ahead_kind, nearest) = rule.window();
                let mut r = EnqueueRequest::new(&queue, kind, attempt, &value)
                    .with_ahead(ahead_kind, nearest);
                if retry {
                    r = r.retried();
                }
                remote.enqueue(r).await
            }
        });
        let answer = answer_of(
            shared,
            &mut pending.inflight,
            task,
            &mut pending.maybe_created,
            "enqueue",
        );
        let e = match answer.await? {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        // Refused before anything was sent: nothing can have been created.
        pending.maybe_created |= !matches!(
            e,
            Error::InvalidName(_) | Error::InvalidConfig(_) | Error::InvalidValue(_)
        );
        if !e.is_temporary() {
            return Err(e);
        }
        debug!(error = %e, "enqueue failed, retrying");
        let pause = backoff.next_delay();
        if wait.deadline().is_some_and(|d| Instant::now() + pause >= d) {
            return Err(wait.timed_out());
        }
        shared.unless_lost(tokio::time::sleep(pause)).await?;
    }
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
