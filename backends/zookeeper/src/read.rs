//! The reads of a ZooKeeper session: a queue's head and waiting until it or its value changes,
//! a queue's entries with their values, and every node of a namespace.

use std::time::{Duration, SystemTime};

use fencelock::backend::{Entry, EntryInfo, QueueId};
use fencelock::{FencingToken, Result};
use tracing::debug;
use zookeeper_client as zk;

use crate::error::{self};
use crate::layout::{
    is_entry_name, is_latch, join, namespace_root, queue_path, sorted_entries, value_path,
};
use crate::lifecycle::ZkSession;
use crate::nodes::entry;
use crate::watch::check_session_event;

pub(crate) async fn head(session: &ZkSession, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> {
    session
        .unless_moved("head", async { session.read_head(queue).await })
        .await
}

pub(crate) async fn wait_queue_change(
    session: &ZkSession,
    queue: &QueueId,
    seen: Option<&(Entry, Vec<u8>)>,
) -> Result<()> {
    session
        .unless_moved("wait_queue_change", async {
            session.wait_head_change(queue, seen).await
        })
        .await
}

pub(crate) async fn inspect(session: &ZkSession, queue: &QueueId) -> Result<Vec<EntryInfo>> {
    session
        .unless_moved("inspect", async { session.inspect_queue(queue).await })
        .await
}

/// How many `getChildren` a listing has out at once.
const LIST_IN_FLIGHT: usize = 32;

pub(crate) async fn list(session: &ZkSession, namespace: &str) -> Result<Vec<String>> {
    session
        .unless_moved("list", async {
            const OP: &str = "list";
            let root = namespace_root(namespace, session.chrooted())?;
            let skip_reserved = !session.chrooted();
            let mut out = Vec::new();
            let mut dirs = vec![root.clone()];
            while !dirs.is_empty() {
                let client = session.client()?;
                // At most LIST_IN_FLIGHT requests out at once (a chunk at a time): the server answers a session's
                // requests in order, and the heartbeat (a `sync` on this session) waits behind
                // every one sent before it. Unbounded, a namespace of a million parent nodes
                // held the heartbeat past the TTL and lost the session (seen in the bench).
                let mut lists = Vec::with_capacity(dirs.len());
                for chunk in dirs.chunks(LIST_IN_FLIGHT) {
                    lists.extend(
                        futures::future::join_all(chunk.iter().map(|d| client.list_children(d)))
                            .await,
                    );
                }
                let mut next = Vec::new();
                for (dir, res) in dirs.iter().zip(lists) {
                    let children = match res {
                        Ok(c) => c,
                        Err(zk::Error::NoNode) => continue,
                        // A node below the namespace that another client made unreadable to us
                        // holds nothing of ours (we make our nodes readable): skipped, rather than
                        // fail the listing of the whole namespace.
                        Err(zk::Error::NoAuth) if *dir != root => {
                            debug!(node = %dir, "skipped a node we may not read");
                            continue;
                        }
                        Err(e) => return Err(error::map(OP, e)),
                    };
                    for child in children {
                        if skip_reserved && dir == "/" && child == "zookeeper" {
                            continue;
                        }
                        let path = join(dir, &child);
                        if is_entry_name(&child) {
                            out.push(path);
                        } else {
                            next.push(path);
                        }
                    }
                }
                dirs = next;
            }
            out.sort();
            Ok(out)
        })
        .await
}

impl ZkSession {
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

    /// Waits until the head of `queue` or its value differs from `seen`.
    ///
    /// While a head is known, only its node (a data watch: its deletion or new data) and its
    /// proclaimed value are watched: it can change only by going, as entries that join take
    /// later sequence numbers, behind it; so waiters joining and leaving the tail wake no
    /// observer, and no wake lists the queue. An empty queue is watched with a children watch
    /// on the parent (an exists watch while the parent is missing).
    pub(crate) async fn wait_head_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()> {
        match seen {
            None => self.wait_first_entry(queue).await,
            Some((entry, value)) => self.wait_head_gone_or_changed(entry, value).await,
        }
    }

    /// Waits until `queue` has an entry.
    async fn wait_first_entry(&self, queue: &QueueId) -> Result<()> {
        const OP: &str = "watch queue";
        let parent = queue_path(queue, self.chrooted())?;
        loop {
            let broken = self.broken(OP);
            let client = self.client()?;
            let res = client.get_and_watch_children(&parent).await;
            let (children, child_watch) = match res {
                Ok((children, _, w)) => (children, w),
                Err(zk::Error::NoNode) => {
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
            drop(client);
            if !sorted_entries(children, queue.kind).is_empty() {
                return Ok(());
            }
            tokio::select! {
                ev = child_watch.changed() => check_session_event(OP, &ev)?,
                err = broken => return Err(err),
            }
        }
    }

    /// Waits until the head entry `seen_entry` goes or its value is no longer `seen_value`.
    async fn wait_head_gone_or_changed(&self, seen_entry: &Entry, seen_value: &[u8]) -> Result<()> {
        const OP: &str = "watch queue";
        loop {
            let broken = self.broken(OP);
            let client = self.client()?;
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
            if stat.czxid as u64 != seen_entry.token.get() || value != seen_value {
                return Ok(());
            }
            let value_changed = async {
                match value_watch {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = data_watch.changed() => check_session_event(OP, &ev)?,
                ev = value_changed => check_session_event(OP, &ev)?,
                err = broken => return Err(err),
            }
        }
    }

    /// Every entry of `queue` with its stat and value, in queue order: one listing, then every
    /// node read in one pipelined round trip. Entries gone in between are skipped.
    pub(crate) async fn inspect_queue(&self, queue: &QueueId) -> Result<Vec<EntryInfo>> {
        const OP: &str = "inspect";
        let parent = queue_path(queue, self.chrooted())?;
        let sorted = sorted_entries(self.children(OP, &parent).await?, queue.kind);
        let client = self.client()?;
        // Every request goes out now (the client sends on call); the replies are awaited after.
        let reads: Vec<_> = sorted
            .iter()
            .map(|l| {
                let path = join(&parent, &l.name);
                let proclaimed = value_path(&path)
                    .filter(|_| is_latch(&path))
                    .map(|v| client.get_data(&v));
                (
                    path,
                    l.kind,
                    client.get_data(&join(&parent, &l.name)),
                    proclaimed,
                )
            })
            .collect();
        let mut out = Vec::with_capacity(reads.len());
        for (path, kind, node, proclaimed) in reads {
            let proclaimed = match proclaimed {
                Some(f) => match f.await {
                    Ok((v, _)) => Some(v),
                    Err(zk::Error::NoNode) => None,
                    Err(e) => return Err(error::map(OP, e)),
                },
                None => None,
            };
            let (data, stat) = match node.await {
                Ok(v) => v,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(error::map(OP, e)),
            };
            out.push(EntryInfo::new(
                path,
                FencingToken::new(stat.czxid as u64),
                kind,
                format!("{:x}", stat.ephemeral_owner as u64),
                proclaimed.unwrap_or(data),
                SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(stat.ctime.max(0) as u64)),
            ));
        }
        Ok(out)
    }
}
