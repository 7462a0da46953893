//! The queue operations of a ZooKeeper session: enqueue (one queue or several at once), wait
//! for the entries ahead, re-read them, remove or abandon an entry, set its value (a leader's
//! proclaimed value lives outside the election's parent, see [`value_path`]).

use fencelock::backend::{Ahead, EnqueueRequest, Enqueued, Entry, EntryKind, Peer, QueueId};
use fencelock::{Error, Result};
use tracing::debug;
use uuid::Uuid;
use zookeeper_client as zk;

use crate::error::{self};
use crate::layout::{basename, is_latch, queue_path, sorted_entries, value_path};
use crate::lifecycle::ZkSession;
use crate::nodes::ahead_of;
use crate::watch::DataWatch;

/// How often a proclaim retries when the node of values vanishes under it.
const PROCLAIM_ATTEMPTS: usize = 5;

pub(crate) async fn enqueue(session: &ZkSession, req: EnqueueRequest<'_>) -> Result<Enqueued> {
    session
        .unless_moved("enqueue", async {
            const OP: &str = "enqueue";
            let parent = session.parent_of(&req)?;
            if req.retry {
                // The create of an earlier try may have succeeded with its reply lost: adopt the
                // node if it is there (ours: named with the attempt, owned by this session).
                // Caught up with the leader first: the session may have moved to a server that
                // has not applied that create yet, and a second node would be made behind it,
                // the first left in the queue ahead of everyone, owned by no guard.
                session.sync(OP).await?;
                let children = session.children(OP, &parent).await?;
                let mut found = session
                    .find_own(&parent, &children, &req)
                    .await?
                    .into_iter();
                if let Some(own) = found.next() {
                    // Earlier tries that each made a node: the first is adopted, the others go.
                    for extra in found {
                        session.delete(OP, &extra.key).await?;
                    }
                    debug!(key = %own.key, "adopted the entry of a create whose reply was lost");
                    let sorted = sorted_entries(children, req.queue.kind);
                    let ahead = ahead_of(&parent, &sorted, basename(&own.key), req.ahead)
                        .unwrap_or_default();
                    return Ok(Enqueued::new(own, ahead));
                }
            }
            let created = session.create_listed(&parent, &req).await?;
            let own = created.entry;
            let name = basename(&own.key).to_string();
            // The listing sent with the create shows our node; should it not, list again.
            let listed = created.listing.and_then(|c| {
                ahead_of(
                    &parent,
                    &sorted_entries(c, req.queue.kind),
                    &name,
                    req.ahead,
                )
            });
            let ahead = match listed {
                Some(ahead) => ahead,
                None => {
                    let children = session.children(OP, &parent).await?;
                    ahead_of(
                        &parent,
                        &sorted_entries(children, req.queue.kind),
                        &name,
                        req.ahead,
                    )
                    .ok_or_else(|| Error::EntryVanished {
                        key: own.key.clone(),
                    })?
                }
            };
            Ok(Enqueued::new(own, ahead))
        })
        .await
}

pub(crate) async fn enqueue_all(
    session: &ZkSession,
    reqs: &[EnqueueRequest<'_>],
) -> Result<Option<Vec<Entry>>> {
    session
        .unless_moved("enqueue_all", async { session.create_all(reqs).await })
        .await
}

pub(crate) async fn wait(session: &ZkSession, own: &Entry, target: &Peer) -> Result<()> {
    session
        .unless_moved("wait", async {
            let w = DataWatch {
                op: "wait",
                path: &target.key,
                own: Some(own),
                gone: || Ok(()),
            };
            // Our node is checked now and then (and with any re-read of the target, see
            // `DataWatch::own`): a waiter watches only the node ahead of it, so an operator's
            // delete of ours would be learnt only at our turn.
            let still_there = || async move {
                match session.client()?.check_stat(&own.key).await {
                    Ok(stat) => Ok(stat.is_some_and(|s| s.czxid as u64 == own.token.get())),
                    Err(e) => Err(error::map("check entry", e)),
                }
            };
            fencelock_net::unless_own_vanishes(
                session.ttl,
                &own.key,
                session.watch_data(w, |_, _| None),
                still_there,
            )
            .await
        })
        .await
}

pub(crate) async fn still_ahead(
    session: &ZkSession,
    own: &Entry,
    queue: &QueueId,
    kind: Option<EntryKind>,
    nearest: usize,
) -> Result<Vec<Peer>> {
    session
        .unless_moved("still_ahead", async {
            const OP: &str = "read queue";
            // Our node's parent, from its path (made and checked at the enqueue): this read
            // follows each wake-up, on the handoff's critical path.
            let parent = match own.key.rsplit_once('/') {
                Some((parent, _)) if !parent.is_empty() => parent.to_string(),
                _ => queue_path(queue, session.chrooted())?,
            };
            // One request: our node is in the listing if it still exists (its name carries the
            // attempt's uuid: never re-used, so its presence is its identity). Curator's recipes
            // list the children on each wake-up too.
            let children = match session.client()?.list_children(&parent).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => Vec::new(),
                Err(e) => return Err(error::map(OP, e)),
            };
            if !children.iter().any(|c| c == basename(&own.key)) {
                return Err(Error::EntryVanished {
                    key: own.key.clone(),
                });
            }
            let sorted = sorted_entries(children, queue.kind);
            let before = sorted.partition_point(|l| l.seq < own.order);
            Ok(crate::nodes::nearest(
                &parent,
                &sorted[..before],
                Ahead { kind, nearest },
            ))
        })
        .await
}

pub(crate) async fn wait_own_gone(session: &ZkSession, own: &Entry) -> Result<()> {
    // Our own node, which may stay for hours: a wait given up (a dropped `lost()`) removes
    // its watch rather than leave it, and a task, until the node goes.
    session
        .unless_moved("wait_own_gone", async {
            let w = DataWatch {
                op: "watch entry",
                path: &own.key,
                own: None,
                gone: || Ok(()),
            };
            session
                .watch_data(w, |_, stat| {
                    (stat.czxid as u64 != own.token.get()).then_some(Ok(()))
                })
                .await
        })
        .await
}

pub(crate) async fn remove(session: &ZkSession, e: &Entry) -> Result<bool> {
    session
        .unless_moved("remove", async {
            let deleted = session.delete("delete entry", &e.key).await?;
            if deleted {
                debug!(key = %e.key, "deleted entry");
            }
            if is_latch(&e.key) {
                session.forget_value(&e.key).await;
            }
            Ok(deleted)
        })
        .await
}

pub(crate) async fn abandon(
    session: &ZkSession,
    queue: &QueueId,
    kind: EntryKind,
    attempt: Uuid,
) -> Result<()> {
    session
        .unless_moved("abandon", async {
            let req = EnqueueRequest::new(queue, kind, attempt, b"");
            session.abandon_attempt(&req).await
        })
        .await
}

pub(crate) async fn set_value(session: &ZkSession, e: &Entry, value: &[u8]) -> Result<bool> {
    session
        .unless_moved("set_value", async {
            if is_latch(&e.key) {
                // Never on the candidate's node itself: see `layout::value_path`.
                return session.proclaim(e, value).await;
            }
            let client = session.client()?;
            let res = client.set_data(&e.key, value, None).await;
            match res {
                Ok(_) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(err) => Err(error::map("set value", err)),
            }
        })
        .await
}

impl ZkSession {
    /// Publishes `value` for the candidate `e`, only while its node exists (a `multi` that
    /// checks it): the value node is set, or created (ephemeral, ours) on the first proclaim.
    /// Returns `false` if the candidate's node is gone.
    pub(crate) async fn proclaim(&self, e: &Entry, value: &[u8]) -> Result<bool> {
        const OP: &str = "proclaim";
        let Some(vpath) = value_path(&e.key) else {
            return Ok(false);
        };
        let values = vpath.rsplit_once('/').map_or("", |(p, _)| p).to_string();
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(self.backend.config.acls());
        for _ in 0..PROCLAIM_ATTEMPTS {
            let client = self.client()?;
            let set = |m: &mut zk::MultiWriter<'_>| m.add_set_data(&vpath, value, None);
            match if_present(&client, &e.key, OP, set).await? {
                Guarded::Done => return Ok(true),
                Guarded::Gone => return Ok(false),
                // The first proclaim: create the value node (and its container parent).
                Guarded::Failed(zk::Error::NoNode) => {}
                Guarded::Failed(err) => return Err(error::map(OP, err)),
            }
            let create = |m: &mut zk::MultiWriter<'_>| m.add_create(&vpath, value, &ephemeral);
            match if_present(&client, &e.key, OP, create).await? {
                Guarded::Done => return Ok(true),
                Guarded::Gone => return Ok(false),
                Guarded::Failed(zk::Error::NoNode) => self.ensure_parent(&values).await?,
                // Created meanwhile by a concurrent proclaim of ours: set it.
                Guarded::Failed(zk::Error::NodeExists) => {}
                Guarded::Failed(err) => return Err(error::map(OP, err)),
            }
        }
        Err(Error::backend(
            error::NAME,
            OP,
            true,
            "the node of proclaimed values kept vanishing",
        ))
    }

    /// Deletes the proclaimed value of the candidate `key`, if any (after its node is gone).
    pub(crate) async fn forget_value(&self, key: &str) {
        if let Some(vpath) = value_path(key) {
            let _ = self.delete("forget value", &vpath).await;
        }
    }
}

/// How a write guarded by the presence of a node went.
enum Guarded {
    Done,
    /// The guarding node is gone: nothing was written.
    Gone,
    /// The write itself failed, with this error.
    Failed(zk::Error),
}

/// Commits the write `add` puts in a multi, only if the node at `key` exists (one request).
async fn if_present(
    client: &zk::Client,
    key: &str,
    op: &'static str,
    add: impl FnOnce(&mut zk::MultiWriter<'_>) -> std::result::Result<(), zk::Error>,
) -> Result<Guarded> {
    let mut multi = client.new_multi_writer();
    multi
        .add_check_version(key, -1)
        .map_err(|err| error::map(op, err))?;
    add(&mut multi).map_err(|err| error::map(op, err))?;
    match multi.commit().await {
        Ok(_) => Ok(Guarded::Done),
        Err(zk::MultiWriteError::OperationFailed {
            index: 0,
            source: zk::Error::NoNode,
        }) => Ok(Guarded::Gone),
        Err(zk::MultiWriteError::OperationFailed { index: 1, source }) => {
            Ok(Guarded::Failed(source))
        }
        Err(err) => Err(error::map(op, err.into())),
    }
}
