//! The multi-lock's acquisition: an exclusive entry in every queue in one atomic request.

use uuid::Uuid;

use super::pending::{create, PendingAll};
use crate::backend::{EnqueueRequest, EntryKind, QueueId};
use crate::session::{in_flight, LocalSlot};
use crate::tenure::Tenure;
use crate::{Result, Session};

/// Takes an exclusive entry in every one of `queues` in one atomic request, each only if it
/// heads its queue at once, holding the local slots `locals` (one per queue); `None` if any is
/// taken (then nothing was created). Retries temporary errors.
pub(crate) async fn acquire_all(
    session: &Session,
    queues: &[QueueId],
    locals: Vec<LocalSlot>,
) -> Result<Option<Vec<Tenure>>> {
    let shared = session.shared().clone();
    shared.check_alive()?;
    let mut pending = PendingAll {
        shared: shared.clone(),
        queues: queues.iter().map(|q| (q.clone(), Uuid::new_v4())).collect(),
        inflight: None,
        maybe_created: false,
        locals,
        undoing: None,
    };
    let queues_tried = pending.queues.clone();
    let entries = create(
        &shared,
        &mut pending.inflight,
        &mut pending.maybe_created,
        None,
        "enqueue all",
        |retry| {
            let remote = shared.remote.clone();
            let queues = queues_tried.clone();
            in_flight(async move {
                let reqs: Vec<EnqueueRequest<'_>> = queues
                    .iter()
                    .map(|(q, attempt)| {
                        let r = EnqueueRequest::new(q, EntryKind::Exclusive, *attempt, b"");
                        if retry {
                            r.retried()
                        } else {
                            r
                        }
                    })
                    .collect();
                remote.enqueue_all(&reqs).await
            })
        },
    )
    .await?;
    let Some(entries) = entries else {
        // This try created nothing (the contract of `enqueue_all`); an earlier one whose reply
        // was lost may have, in queues the retry then found taken: abandon those.
        if pending.maybe_created {
            pending.abandon_now().await?;
        }
        return Ok(None);
    };
    pending.maybe_created = false;
    let locals = std::mem::take(&mut pending.locals);
    let tenures = queues
        .iter()
        .zip(entries)
        .zip(locals)
        .map(|((queue, entry), local)| {
            Tenure::new(session.clone(), queue.clone(), entry, Some(local))
        })
        .collect::<Vec<_>>();
    // Never report a grant past the local deadline (dropped, the tenures hand their removal
    // to the background task).
    shared.check_alive()?;
    Ok(Some(tenures))
}
