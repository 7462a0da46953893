//! The node plumbing of the queue operations: creating entries (with the listing in the same
//! round trip, and the parent when it is new), finding one's own entries again, deleting, and
//! the all-or-nothing multi-create.

use std::sync::atomic::Ordering;

use fencelock::backend::{Ahead, EnqueueRequest, Entry, EntryKind, Peer};
use fencelock::{Error, FencingToken, Result};
use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::error;
use crate::layout::{
    basename, is_attempt, join, marker, protected_name, queue_path, sequence_of, sorted_entries,
    Listed,
};
use crate::lifecycle::ZkSession;

/// How often a create is retried when the parent vanishes under it (a container reaped by the
/// server between our mkdir and our create).
const CREATE_ATTEMPTS: usize = 10;

/// An entry from a node's path, sequence and creation stat.
pub(crate) fn entry(key: String, seq: u64, kind: EntryKind, czxid: i64) -> Entry {
    Entry {
        key,
        token: FencingToken::new(czxid as u64),
        order: seq,
        kind,
    }
}

/// The entries of `sorted` (a queue's listing) ahead of the entry named `own` that `want`
/// asks for (of its kind, if given; the nearest ones), in queue order, or `None` if `own` is
/// not in it. Only those get a path made: a long queue costs its listing, not a path per entry.
pub(crate) fn ahead_of(
    parent: &str,
    sorted: &[Listed],
    own: &str,
    want: Ahead,
) -> Option<Vec<Peer>> {
    let pos = sorted.iter().position(|l| l.name == own)?;
    Some(nearest(parent, &sorted[..pos], want))
}

/// The `want.nearest` last entries of `before` (of `want.kind`, if given), in queue order, as
/// peers under `parent`.
pub(crate) fn nearest(parent: &str, before: &[Listed], want: Ahead) -> Vec<Peer> {
    let mut peers: Vec<Peer> = before
        .iter()
        .rev()
        .filter(|l| want.kind.is_none_or(|k| l.kind == k))
        .take(want.nearest)
        .map(|l| Peer {
            key: join(parent, &l.name),
            order: l.seq,
            kind: l.kind,
        })
        .collect();
    peers.reverse();
    peers
}

/// A node created by a create request: its path, and the entry it is.
pub(crate) struct Created {
    pub(crate) entry: Entry,
    /// The parent's children, listed right behind the create; `None` if the listing failed.
    pub(crate) listing: Option<Vec<String>>,
}

impl ZkSession {
    pub(crate) fn chrooted(&self) -> bool {
        self.backend.config.chroot.is_some()
    }

    /// The parent node of `req`'s queue.
    pub(crate) fn parent_of(&self, req: &EnqueueRequest<'_>) -> Result<String> {
        queue_path(req.queue, self.chrooted())
    }

    /// Waits until the server this session is connected to has applied every transaction the
    /// leader committed before (a `sync`): what the session reads next is at least that recent.
    pub(crate) async fn sync(&self, op: &'static str) -> Result<()> {
        let client = self.client()?;
        client.sync("/").await.map_err(|e| error::map(op, e))
    }

    /// Children of `parent` (none if it does not exist).
    pub(crate) async fn children(&self, op: &'static str, parent: &str) -> Result<Vec<String>> {
        let client = self.client()?;
        let res = client.list_children(parent).await;
        match res {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(error::map(op, e)),
        }
    }

    /// How parents are created: CONTAINER nodes (the server deletes them once empty), or
    /// persistent ones on servers without containers.
    fn parent_mode(&self) -> zk::CreateMode {
        if self.backend.containers.load(Ordering::Relaxed) {
            zk::CreateMode::Container
        } else {
            zk::CreateMode::Persistent
        }
    }

    /// Creates `parent` and its ancestors as CONTAINER nodes (persistent on old servers).
    pub(crate) async fn ensure_parent(&self, parent: &str) -> Result<()> {
        let client = self.client()?;
        let acls = self.backend.config.acls();
        loop {
            let containers = self.backend.containers.load(Ordering::Relaxed);
            let mode = if containers {
                zk::CreateMode::Container
            } else {
                zk::CreateMode::Persistent
            };
            match client.mkdir(parent, &mode.with_acls(acls)).await {
                Ok(()) => return Ok(()),
                Err(zk::Error::Unimplemented) if containers => {
                    warn!("the ZooKeeper servers do not support container nodes: parents are created persistent");
                    self.backend.containers.store(false, Ordering::Relaxed);
                }
                Err(zk::Error::NoNode) => {
                    return Err(Error::backend(
                        error::NAME,
                        "create parent",
                        false,
                        "the chroot node does not exist",
                    ))
                }
                Err(e) => return Err(error::map("create parent", e)),
            }
        }
    }

    /// Creates the entry of `attempt` in `parent`, creating the parents if needed, and lists
    /// the children of `parent` in the same round trip: the listing is sent right behind the
    /// create, without waiting for its reply. ZooKeeper processes the requests of one session
    /// in order (a read waits for the session's earlier writes, on followers too), so the
    /// listing shows our new node. (It sets no watch: a children watch would fire at the next
    /// create or delete in the queue, a notification per acquisition that nobody needs.)
    pub(crate) async fn create_listed(
        &self,
        parent: &str,
        req: &EnqueueRequest<'_>,
    ) -> Result<Created> {
        const OP: &str = "create entry";
        let m = marker(req.queue.kind, req.kind);
        let prefix = join(parent, &protected_name(req.attempt, m));
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.backend.config.acls());
        for _ in 0..CREATE_ATTEMPTS {
            let client = self.client()?;
            // A parent not known to exist is created in the same round trip, ahead of the
            // entry (a failure because it exists is fine): a new lock costs no extra round
            // trip, an existing one no extra request.
            let known = self.backend.parents.knows(parent);
            let make_parent = (!known).then(|| {
                client.create(
                    parent,
                    b"",
                    &self.parent_mode().with_acls(self.backend.config.acls()),
                )
            });
            // The requests go out now, in this order (the client sends on call).
            let create = client.create(&prefix, req.value, &options);
            let listing = client.list_children(parent);
            if let Some(made) = make_parent {
                // Whatever it says: it exists now (or existed), or an ancestor is missing, or
                // the server has no container nodes, and then the create below fails with
                // NoNode and `ensure_parent` sorts it out.
                let _ = made.await;
            }
            match create.await {
                Ok((stat, seq)) => {
                    self.backend.parents.remember(parent);
                    let name = format!("{}{seq}", basename(&prefix));
                    // Read from the name, as listings read it (a counter past 2^31 - 1 is
                    // negative: see `sequence_of`).
                    let seq = crate::layout::sequence_of(&name, m)
                        .unwrap_or_else(|| seq.into_i64() as u64);
                    let e = entry(join(parent, &name), seq, req.kind, stat.czxid);
                    debug!(key = %e.key, czxid = stat.czxid, "created entry");
                    let listing = listing.await.ok();
                    return Ok(Created { entry: e, listing });
                }
                Err(zk::Error::NoNode) => {
                    // Gone (a container reaped when it emptied) or never made: create the
                    // whole path.
                    self.backend.parents.forget(parent);
                    self.ensure_parent(parent).await?;
                }
                Err(e) => return Err(error::map(OP, e)),
            }
        }
        Err(Error::backend(
            error::NAME,
            OP,
            true,
            "the parent node kept vanishing",
        ))
    }

    /// Our entries of `attempt` among `children` of `parent`: children named with the
    /// attempt's uuid whose ephemeral owner is this session. A node of another session with the
    /// same uuid is never returned.
    pub(crate) async fn find_own(
        &self,
        parent: &str,
        children: &[String],
        req: &EnqueueRequest<'_>,
    ) -> Result<Vec<Entry>> {
        const OP: &str = "find entry";
        let m = marker(req.queue.kind, req.kind);
        let mut found = Vec::new();
        for name in children.iter().filter(|n| is_attempt(n, req.attempt, m)) {
            let Some(seq) = sequence_of(name, m) else {
                continue;
            };
            let path = join(parent, name);
            let client = self.client()?;
            let res = client.check_stat(&path).await;
            match res {
                Ok(Some(stat)) if stat.ephemeral_owner == self.id => {
                    found.push(entry(path, seq, req.kind, stat.czxid));
                }
                Ok(Some(stat)) => {
                    warn!(%path, owner = %format!("{:x}", stat.ephemeral_owner as u64), "a node with our attempt id belongs to another session: ignored");
                }
                Ok(None) => {}
                Err(e) => return Err(error::map(OP, e)),
            }
        }
        found.sort_by_key(|e| e.order);
        Ok(found)
    }

    /// Deletes `key` if it exists; whether it did.
    pub(crate) async fn delete(&self, op: &'static str, key: &str) -> Result<bool> {
        let client = self.client()?;
        let res = client.delete(key, None).await;
        match res {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(error::map(op, e)),
        }
    }

    /// Deletes every entry of `req`'s attempt that this session created in its queue.
    pub(crate) async fn abandon_attempt(&self, req: &EnqueueRequest<'_>) -> Result<()> {
        let parent = self.parent_of(req)?;
        // Caught up with the leader: a create of the attempt that committed through another
        // server must be seen, or it stays (see `enqueue`'s retry).
        self.sync("abandon").await?;
        let children = self.children("abandon", &parent).await?;
        for e in self.find_own(&parent, &children, req).await? {
            self.delete("abandon", &e.key).await?;
        }
        Ok(())
    }

    /// The all-or-nothing create of [`enqueue_all`](fencelock::backend::BackendSession::enqueue_all):
    /// one `multi` creates every entry (or none), the listings of the parents ride behind it in
    /// the same round trip, and if any entry does not head its queue a second `multi` deletes
    /// them all before this returns. ZooKeeper cannot compare a parent's children inside a
    /// `multi`, so a refused set is visible to others for that one round trip (they queue
    /// behind it and are let go when it is deleted); nothing is left behind.
    pub(crate) async fn create_all(
        &self,
        reqs: &[EnqueueRequest<'_>],
    ) -> Result<Option<Vec<Entry>>> {
        const OP: &str = "create entries";
        let parents = reqs
            .iter()
            .map(|r| self.parent_of(r))
            .collect::<Result<Vec<_>>>()?;
        // A retry first removes whatever an earlier try of the same attempts created.
        for r in reqs.iter().filter(|r| r.retry) {
            self.abandon_attempt(r).await?;
        }
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.backend.config.acls());
        for _ in 0..CREATE_ATTEMPTS {
            let client = self.client()?;
            let mut multi = client.new_multi_writer();
            for (r, parent) in reqs.iter().zip(&parents) {
                let m = marker(r.queue.kind, r.kind);
                multi
                    .add_create(
                        &join(parent, &protected_name(r.attempt, m)),
                        r.value,
                        &options,
                    )
                    .map_err(|e| error::map(OP, e))?;
            }
            let commit = multi.commit();
            let listings: Vec<_> = parents.iter().map(|p| client.list_children(p)).collect();
            let results = match commit.await {
                Ok(results) => results,
                Err(e) => match zk::Error::from(e) {
                    zk::Error::NoNode => {
                        for p in &parents {
                            self.ensure_parent(p).await?;
                        }
                        continue;
                    }
                    e => return Err(error::map(OP, e)),
                },
            };
            // A create inside a multi reports no stat (ZooKeeper 3.8 answers -1s): read the
            // czxids of the new nodes, all in one round trip.
            let mut created = Vec::with_capacity(reqs.len());
            for ((result, r), parent) in results.into_iter().zip(reqs).zip(&parents) {
                let path = match result {
                    zk::MultiWriteResult::Create { path, .. } => path,
                    other => {
                        return Err(Error::backend(
                            error::NAME,
                            OP,
                            false,
                            format!("unexpected multi result {other:?}"),
                        ))
                    }
                };
                let m = marker(r.queue.kind, r.kind);
                let name = basename(&path).to_string();
                let seq = sequence_of(&name, m).unwrap_or_default();
                created.push((join(parent, &name), seq, r.kind));
            }
            let stats: Vec<_> = created
                .iter()
                .map(|(key, ..)| client.check_stat(key))
                .collect();
            let mut entries = Vec::with_capacity(reqs.len());
            for ((key, seq, kind), stat) in created.into_iter().zip(stats) {
                let czxid = match stat.await {
                    Ok(Some(stat)) => stat.czxid,
                    // Gone already (deleted by an operator): it cannot head its queue.
                    Ok(None) => 0,
                    Err(e) => return Err(error::map(OP, e)),
                };
                entries.push(entry(key, seq, kind, czxid));
            }
            let mut heads = true;
            for ((listing, e), r) in listings.into_iter().zip(&entries).zip(reqs) {
                let children = match listing.await {
                    Ok(c) => c,
                    Err(err) => {
                        self.delete_all(&entries).await?;
                        return Err(error::map(OP, err));
                    }
                };
                let sorted = sorted_entries(children, r.queue.kind);
                heads &= e.token.get() != 0
                    && sorted.first().is_some_and(|l| l.name == basename(&e.key));
            }
            if heads {
                return Ok(Some(entries));
            }
            self.delete_all(&entries).await?;
            return Ok(None);
        }
        Err(Error::backend(
            error::NAME,
            OP,
            true,
            "the parent nodes kept vanishing",
        ))
    }

    /// Deletes `entries` in one `multi` (those already gone are skipped first).
    async fn delete_all(&self, entries: &[Entry]) -> Result<()> {
        let client = self.client()?;
        let mut multi = client.new_multi_writer();
        for e in entries {
            multi
                .add_delete(&e.key, None)
                .map_err(|err| error::map("delete entries", err))?;
        }
        match multi.commit().await {
            Ok(_) => Ok(()),
            // One was deleted already (an operator, an expiry): delete the rest one by one.
            Err(_) => {
                for e in entries {
                    self.delete("delete entries", &e.key).await?;
                }
                Ok(())
            }
        }
    }
}
