//! Elections: the leader's value (proclaimed values live outside the election's parent, see
//! [`value_path`]) and waiting until the head of a queue or its value changes.

use fencelock::backend::{Entry, QueueId};
use fencelock::{Error, Result};
use zookeeper_client as zk;

use crate::error;
use crate::layout::{is_latch, join, queue_path, sorted_entries, value_path};
use crate::queue::entry;
use crate::session::ZkSession;
use crate::watch::check_session_event;

/// How often a proclaim retries when the node of values vanishes under it.
const PROCLAIM_ATTEMPTS: usize = 5;

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
            let mut multi = client.new_multi_writer();
            multi
                .add_check_version(&e.key, -1)
                .map_err(|err| error::map(OP, err))?;
            multi
                .add_set_data(&vpath, value, None)
                .map_err(|err| error::map(OP, err))?;
            match multi.commit().await {
                Ok(_) => return Ok(true),
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::NoNode,
                }) => return Ok(false),
                Err(zk::MultiWriteError::OperationFailed {
                    index: 1,
                    source: zk::Error::NoNode,
                }) => {}
                Err(err) => return Err(error::map(OP, err.into())),
            }
            // The first proclaim: create the value node (and its container parent).
            let mut multi = client.new_multi_writer();
            multi
                .add_check_version(&e.key, -1)
                .map_err(|err| error::map(OP, err))?;
            multi
                .add_create(&vpath, value, &ephemeral)
                .map_err(|err| error::map(OP, err))?;
            match multi.commit().await {
                Ok(_) => return Ok(true),
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::NoNode,
                }) => return Ok(false),
                Err(zk::MultiWriteError::OperationFailed {
                    index: 1,
                    source: zk::Error::NoNode,
                }) => {
                    self.ensure_parent(&values).await?;
                }
                // Created meanwhile by a concurrent proclaim of ours: set it.
                Err(zk::MultiWriteError::OperationFailed {
                    index: 1,
                    source: zk::Error::NodeExists,
                }) => {}
                Err(err) => return Err(error::map(OP, err.into())),
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

    /// The first entry of `queue` and its value (for an election, the value it proclaimed
    /// last, else its campaign value), read in one round trip.
    pub(crate) async fn read_head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> {
        const OP: &str = "read head";
        let parent = queue_path(queue, self.chrooted())?;
        loop {
            let children = self.children(OP, &parent).await?;
            let Some(first) = sorted_entries(children, queue.kind).into_iter().next() else {
                return Ok(None);
            };
            let path = join(&parent, &first.name);
            let client = self.client()?;
            // Both requests go out now: one round trip.
            let node = client.get_data(&path);
            let vpath = value_path(&path).filter(|_| is_latch(&path));
            let proclaimed = vpath.as_deref().map(|v| client.get_data(v));
            let node = node.await;
            let proclaimed = match proclaimed {
                Some(f) => Some(f.await),
                None => None,
            };
            match node {
                Ok((data, stat)) => {
                    let value = match proclaimed {
                        Some(Ok((v, _))) => v,
                        Some(Err(zk::Error::NoNode)) | None => data,
                        Some(Err(err)) => return Err(error::map(OP, err)),
                    };
                    return Ok(Some((
                        entry(path, first.seq, first.kind, stat.czxid),
                        value,
                    )));
                }
                Err(zk::Error::NoNode) => continue, // the head went meanwhile
                Err(err) => return Err(error::map(OP, err)),
            }
        }
    }

    /// Waits until the head of `queue` or its value differs from `seen`, with a children
    /// watch on the parent (an exists watch while the parent is missing) and a data watch on
    /// the head.
    pub(crate) async fn wait_head_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()> {
        const OP: &str = "watch queue";
        let parent = queue_path(queue, self.chrooted())?;
        loop {
            let broken = self.broken(OP);
            let client = self.client()?;
            let res = client.get_and_watch_children(&parent).await;
            let (children, child_watch) = match res {
                Ok((children, _, w)) => (children, w),
                Err(zk::Error::NoNode) => {
                    if seen.is_some() {
                        return Ok(());
                    }
                    // Wait for the parent to appear.
                    let res = client.check_and_watch_stat(&parent).await;
                    drop(client);
                    match res {
                        Ok((Some(_), _)) => continue,
                        Ok((None, w)) => {
                            tokio::select! {
                                ev = w.changed() => {
                                    check_session_event(OP, &ev)?;
                                    continue;
                                }
                                err = broken => return Err(err),
                            }
                        }
                        Err(err) => return Err(error::map(OP, err)),
                    }
                }
                Err(err) => return Err(error::map(OP, err)),
            };
            let head = sorted_entries(children, queue.kind).into_iter().next();
            let (seen_entry, seen_value) = match (head, seen) {
                (None, None) => {
                    drop(client);
                    tokio::select! {
                        ev = child_watch.changed() => {
                            check_session_event(OP, &ev)?;
                            continue;
                        }
                        err = broken => return Err(err),
                    }
                }
                (Some(first), Some((e, v))) if join(&parent, &first.name) == e.key => (e, v),
                _ => return Ok(()),
            };
            // The head's node and its proclaimed value, both read and watched, in one round
            // trip; the value node may not exist (an exists watch fires when it is created).
            let vpath = value_path(&seen_entry.key).filter(|_| is_latch(&seen_entry.key));
            let (node, proclaimed, value_read) = {
                let node = client.get_and_watch_data(&seen_entry.key);
                let proclaimed = vpath.as_deref().map(|v| client.check_and_watch_stat(v));
                let value_read = vpath.as_deref().map(|v| client.get_data(v));
                let node = node.await;
                let proclaimed = match proclaimed {
                    Some(f) => Some(f.await),
                    None => None,
                };
                let value_read = match value_read {
                    Some(f) => Some(f.await),
                    None => None,
                };
                (node, proclaimed, value_read)
            };
            drop(client);
            let (data, stat, data_watch) = match node {
                Err(zk::Error::NoNode) => return Ok(()),
                Err(err) => return Err(error::map(OP, err)),
                Ok(v) => v,
            };
            let (value, value_watch) = match (proclaimed, value_read) {
                (None, _) => (data, None),
                (Some(Err(err)), _) => return Err(error::map(OP, err)),
                (Some(Ok((_, w))), Some(Ok((v, _)))) => (v, Some(w)),
                (Some(Ok((_, w))), Some(Err(zk::Error::NoNode))) => (data, Some(w)),
                (Some(Ok(_)), Some(Err(err))) => return Err(error::map(OP, err)),
                (Some(Ok((_, w))), None) => (data, Some(w)),
            };
            if stat.czxid as u64 != seen_entry.token.get() || value != *seen_value {
                return Ok(());
            }
            let value_changed = async {
                match value_watch {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = child_watch.changed() => check_session_event(OP, &ev)?,
                ev = data_watch.changed() => check_session_event(OP, &ev)?,
                ev = value_changed => check_session_event(OP, &ev)?,
                err = broken => return Err(err),
            }
        }
    }
}
