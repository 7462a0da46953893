//! Watching an election: waiting until the head of a queue (the leader) or its value changes.

use fencelock::backend::{Entry, QueueId};
use fencelock::Result;
use zookeeper_client as zk;

use crate::error;
use crate::layout::{join, queue_path, sorted_entries};
use crate::session::ZkSession;
use crate::watch::check_session_event;

impl ZkSession {
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
            let res = client.get_and_watch_data(&seen_entry.key).await;
            drop(client);
            let data_watch = match res {
                Err(zk::Error::NoNode) => return Ok(()),
                Err(err) => return Err(error::map(OP, err)),
                Ok((data, stat, w)) => {
                    if stat.czxid as u64 != seen_entry.token.get() || data != *seen_value {
                        return Ok(());
                    }
                    w
                }
            };
            tokio::select! {
                ev = child_watch.changed() => check_session_event(OP, &ev)?,
                ev = data_watch.changed() => check_session_event(OP, &ev)?,
                err = broken => return Err(err),
            }
        }
    }
}
