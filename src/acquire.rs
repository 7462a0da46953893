//! The acquire path shared by every primitive: the local queue first, then one remote entry
//! that waits only on the entries ahead that its rule depends on.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{timeout_at, Instant};
use tracing::{debug, info_span, Instrument};
use uuid::Uuid;

use crate::backend::{EnqueueRequest, Enqueued, Entry, EntryKind, Peer, QueueId, QueueKind};
use crate::session::{Cleanup, EnqueueAllTask, EnqueueTask, LocalQueue, LocalSlot, Shared};
use crate::tenure::Tenure;
use crate::{Error, Result, Session};

/// How long an acquisition may wait.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    /// Until granted (or the session is lost).
    Forever,
    /// Not at all: give up if the lock is taken.
    No,
    /// Until this instant, then fail with a timeout (`after` is the timeout asked for) and
    /// leave no entry.
    Until { deadline: Instant, after: Duration },
}

impl Wait {
    /// Waiting for at most `timeout`. A timeout too large to add to the clock waits forever
    /// (it would never expire anyway).
    pub(crate) fn at_most(timeout: Duration) -> Wait {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => Wait::Until {
                deadline,
                after: timeout,
            },
            None => Wait::Forever,
        }
    }

    fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Until { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    fn timed_out(self) -> Error {
        let after = match self {
            Wait::Until { after, .. } => after,
            _ => Duration::ZERO,
        };
        Error::Timeout {
            op: "acquire",
            after,
        }
    }
}

/// Which entries ahead an entry waits for: the grant rule of one primitive.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rule {
    /// Granted at the head of the queue: waits for the entry just ahead (mutex, election,
    /// writer).
    Exclusive,
    /// Granted when no exclusive entry is ahead: waits for the nearest exclusive entry ahead
    /// (reader).
    Shared,
    /// Granted when fewer than this many entries are ahead: waits for any of them to go (a
    /// semaphore's permit; only one waiter at a time does, see [`crate::Semaphore`]).
    Permits(usize),
}

impl Rule {
    /// The indexes in `ahead` of the entries to wait for next (any one of them going is
    /// progress); empty when granted.
    fn targets(self, ahead: &[Peer]) -> Vec<usize> {
        match self {
            Rule::Exclusive => ahead.len().checked_sub(1).into_iter().collect(),
            Rule::Shared => ahead
                .iter()
                .rposition(|p| p.kind == EntryKind::Exclusive)
                .into_iter()
                .collect(),
            Rule::Permits(n) if ahead.len() < n => Vec::new(),
            Rule::Permits(_) => (0..ahead.len()).collect(),
        }
    }

    /// What [`targets`](Self::targets) needs to know of the entries ahead: their kind (or any)
    /// and how many of the nearest. A semaphore's waiter needs its `n` nearest: fewer than `n`
    /// entries ahead can only come about if one of those goes.
    fn window(self) -> (Option<EntryKind>, usize) {
        match self {
            Rule::Exclusive => (None, 1),
            Rule::Shared => (Some(EntryKind::Exclusive), 1),
            Rule::Permits(n) => (None, n),
        }
    }
}

/// What to acquire: one entry of `kind` in `queue`, granted by `rule`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) queue: &'a QueueId,
    pub(crate) kind: EntryKind,
    pub(crate) rule: Rule,
    pub(crate) value: &'a [u8],
}

/// Checks an entry value against the backend's limit.
pub(crate) fn check_value(shared: &Shared, value: &[u8]) -> Result<()> {
    let max = shared.backend.max_value_len();
    if value.len() > max {
        return Err(Error::InvalidValue(crate::error::InvalidInput::new(
            format!("{} bytes", value.len()),
            format!(
                "longer than the {} backend's limit of {max} bytes",
                shared.backend_name()
            ),
        )));
    }
    Ok(())
}

/// An acquisition in progress. If it is dropped before it becomes a [`Tenure`] (a cancelled
/// future, an error, a timeout), it hands the removal of whatever it may have created to the
/// session's background task, together with the local queue slot, so that the next local waiter
/// cannot start before the remote entry is gone.
struct Pending {
    shared: Arc<Shared>,
    queue: QueueId,
    kind: EntryKind,
    attempt: Uuid,
    /// The create request in flight (see [`EnqueueTask`]).
    inflight: Option<EnqueueTask>,
    /// An earlier try failed in flight: it may have created an entry.
    maybe_created: bool,
    entry: Option<Entry>,
    local: Option<LocalSlot>,
}

impl Pending {
    fn take_cleanup(&mut self) -> Option<Cleanup> {
        let local = self.local.take();
        let (queue, kind, attempt) = (self.queue.clone(), self.kind, self.attempt);
        if let Some(entry) = self.entry.take() {
            Some(Cleanup::Remove {
                queue,
                entry,
                local,
            })
        } else if let Some(inflight) = self.inflight.take() {
            Some(Cleanup::Enqueued {
                queue,
                kind,
                attempt,
                inflight,
                local,
            })
        } else if std::mem::take(&mut self.maybe_created) {
            Some(Cleanup::Abandon {
                queue,
                kind,
                attempt,
                local,
            })
        } else {
            None
        }
    }

    /// Removes what this attempt created *now* and confirms it (`try_lock` and `lock_timeout`
    /// promise that no entry is left when they return). Falls back to the background task if
    /// that fails or is cancelled.
    async fn cleanup_now(mut self) {
        if let Some(inflight) = self.inflight.as_mut() {
            let answer = inflight.await;
            self.inflight = None;
            match answer {
                Ok(Ok(enqueued)) => self.entry = Some(enqueued.entry),
                _ => self.maybe_created = true,
            }
        }
        let shared = self.shared.clone();
        let remote = shared.remote.clone();
        let res = if let Some(entry) = &self.entry {
            shared.retry(|| remote.remove(entry)).await.map(drop)
        } else if self.maybe_created {
            let (queue, kind, attempt) = (&self.queue, self.kind, self.attempt);
            shared.retry(|| remote.abandon(queue, kind, attempt)).await
        } else {
            Ok(())
        };
        if res.is_ok() || shared.end().is_some() {
            self.entry = None;
            self.maybe_created = false;
        }
        // Drop hands off anything left.
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(work) = self.take_cleanup() {
            self.shared.hand_off(work);
        }
    }
}

/// Acquires `req` for `session`, holding the local queue slot `local` (if the primitive has a
/// local queue). Returns `None` only for
/// [`Wait::No`] when the lock is taken.
///
/// The first enqueue request is never cut off by a timeout (it is bounded, like every request,
/// by the session's local deadline): a timeout bounds the waiting and the retries. So
/// `lock_timeout(Duration::ZERO)` grants a free lock, exactly like `try_lock`.
pub(crate) async fn acquire(
    session: &Session,
    req: Request<'_>,
    local: Option<LocalSlot>,
    wait: Wait,
) -> Result<Option<Tenure>> {
    use crate::metrics::{acquisition, primitive, Outcome};
    let started = Instant::now();
    let mut waited = false;
    let res = acquire_recorded(session, req, local, wait, &mut waited).await;
    let outcome = match &res {
        Ok(Some(_)) => Outcome::Granted {
            waited,
            after: started.elapsed(),
        },
        Ok(None) => Outcome::NotAcquired,
        Err(Error::Timeout { .. }) => Outcome::Timeout,
        Err(_) => Outcome::Error,
    };
    let name = session
        .shared()
        .metrics_names
        .then_some(req.queue.name.as_str());
    acquisition(primitive(req.queue, req.kind), name, outcome);
    res
}

/// [`acquire`], telling through `waited` whether the grant had to wait for another holder.
async fn acquire_recorded(
    session: &Session,
    req: Request<'_>,
    local: Option<LocalSlot>,
    wait: Wait,
    waited: &mut bool,
) -> Result<Option<Tenure>> {
    let shared = session.shared().clone();
    shared.check_alive()?;
    let span = info_span!(parent: &shared.span, "acquire", queue = %req.queue, token = tracing::field::Empty);
    async {
        let mut pending = Pending {
            shared: shared.clone(),
            queue: req.queue.clone(),
            kind: req.kind,
            attempt: Uuid::new_v4(),
            inflight: None,
            maybe_created: false,
            entry: None,
            local,
        };
        let enqueued = enqueue(&shared, req, &mut pending, wait).await;
        let res = match enqueued {
            Ok(enqueued) => {
                let own = enqueued.entry.clone();
                pending.entry = Some(own.clone());
                let turn = wait_turn(
                    &shared,
                    req.queue,
                    req.rule,
                    &own,
                    enqueued.ahead,
                    wait,
                    waited,
                );
                match wait.deadline() {
                    Some(d) => timeout_at(d, turn)
                        .await
                        .unwrap_or_else(|_| Err(wait.timed_out())),
                    None => turn.await,
                }
                .map(|granted| granted.then_some(()))
            }
            Err(e) => Err(e),
        };
        match res {
            Ok(Some(())) => {
                // Granted: never report a grant past the local deadline.
                shared.check_alive()?;
                let entry = pending.entry.take().expect("granted entry");
                let local = pending.local.take();
                // An earlier failed create attempt is settled: the retry found or created our
                // one entry, so there is nothing left to abandon.
                pending.maybe_created = false;
                tracing::Span::current().record("token", entry.token.get());
                debug!(key = %entry.key, "granted");
                Ok(Some(Tenure::new(
                    session.clone(),
                    req.queue.clone(),
                    entry,
                    local,
                )))
            }
            Ok(None) => {
                pending.cleanup_now().await;
                Ok(None)
            }
            Err(e @ Error::Timeout { .. }) => {
                pending.cleanup_now().await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
    .instrument(span)
    .await
}

/// Creates the remote entry (retrying temporary errors), as a task of its own per try.
async fn enqueue(
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
        let inflight = pending.inflight.insert(task);
        let answer = shared.unless_lost(inflight).await?;
        pending.inflight = None;
        let e = match answer {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e,
            Err(join) => {
                pending.maybe_created = true;
                return Err(Error::backend(
                    shared.backend_name(),
                    "enqueue",
                    false,
                    join.to_string(),
                ));
            }
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

/// Waits until `rule` grants `own` in `queue`: waits for the entries ahead it depends on,
/// and each time one goes, asks the cluster which are still there (one request, which also
/// confirms `own`). Returns `false` only for [`Wait::No`] when it would have to wait.
async fn wait_turn(
    shared: &Shared,
    queue: &QueueId,
    rule: Rule,
    own: &Entry,
    mut ahead: Vec<Peer>,
    wait: Wait,
    waited: &mut bool,
) -> Result<bool> {
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

/// Waits for this session's local turn on `queue` (see [`crate::session::LocalQueue`]), a
/// reader's turn if `shared_turn` (in a read-write lock). Returns `None` only for [`Wait::No`]
/// when another task of the session has it.
pub(crate) async fn local_turn(
    shared: &Shared,
    queue: &QueueId,
    shared_turn: bool,
    wait: Wait,
) -> Result<Option<LocalSlot>> {
    shared.check_alive()?;
    let make = match queue.kind {
        QueueKind::ReadWrite => LocalQueue::read_write,
        _ => LocalQueue::exclusive,
    };
    let q = shared.local_queue(queue, make);
    match wait {
        Wait::No => Ok(q.try_lock(shared_turn)),
        Wait::Forever => shared.unless_lost(q.lock(shared_turn)).await.map(Some),
        Wait::Until { deadline, .. } => shared
            .unless_lost(timeout_at(deadline, q.lock(shared_turn)))
            .await?
            .map(Some)
            .map_err(|_| wait.timed_out()),
    }
}

/// An all-or-nothing acquisition in progress (see [`acquire_all`]); dropped before it is
/// settled, it hands the removal of whatever it may have created to the background task.
struct PendingAll {
    shared: Arc<Shared>,
    queues: Vec<(QueueId, Uuid)>,
    inflight: Option<EnqueueAllTask>,
    maybe_created: bool,
    locals: Vec<LocalSlot>,
}

impl Drop for PendingAll {
    fn drop(&mut self) {
        let inflight = self.inflight.take();
        if inflight.is_none() && !self.maybe_created {
            return;
        }
        // With `maybe_created`, an earlier try may have created entries and no reply says
        // which: every attempt is abandoned. (No task is spawned here: a drop may happen
        // outside any runtime.)
        self.shared.hand_off(Cleanup::EnqueuedAll {
            queues: std::mem::take(&mut self.queues),
            inflight,
            maybe_created: self.maybe_created,
            locals: std::mem::take(&mut self.locals),
        });
    }
}

impl PendingAll {
    /// Abandons every attempt *now* (an earlier try may have created entries that the last
    /// answer does not report), so that `try_lock` leaves nothing when it returns. Falls back to
    /// the background task (on drop) if that fails.
    async fn abandon_now(&mut self) {
        let remote = self.shared.remote.clone();
        for (queue, attempt) in &self.queues {
            let res = self
                .shared
                .retry(|| remote.abandon(queue, EntryKind::Exclusive, *attempt))
                .await;
            if res.is_err() && self.shared.end().is_none() {
                return;
            }
        }
        self.maybe_created = false;
    }
}

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
    };
    let mut backoff = shared.backoff();
    let entries = loop {
        let task = tokio::spawn({
            let remote = shared.remote.clone();
            let queues = pending.queues.clone();
            let retry = pending.maybe_created;
            async move {
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
            }
        });
        let inflight = pending.inflight.insert(task);
        let answer = shared.unless_lost(inflight).await?;
        pending.inflight = None;
        match answer {
            Ok(Ok(entries)) => break entries,
            Ok(Err(e)) if e.is_temporary() => {
                pending.maybe_created = true;
                debug!(error = %e, "enqueue of all failed, retrying");
                shared.unless_lost(backoff.pause()).await?;
            }
            Ok(Err(e)) => {
                pending.maybe_created = true;
                return Err(e);
            }
            Err(join) => {
                pending.maybe_created = true;
                return Err(Error::backend(
                    shared.backend_name(),
                    "enqueue all",
                    false,
                    join.to_string(),
                ));
            }
        }
    };
    let Some(entries) = entries else {
        // This try created nothing (the contract of `enqueue_all`); an earlier one whose reply
        // was lost may have, in queues the retry then found taken: abandon those.
        if pending.maybe_created {
            pending.abandon_now().await;
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
        .collect();
    Ok(Some(tenures))
}
