//! Inspection of a whole namespace: every queue with entries, who holds and who waits.

use std::collections::HashMap;

use tracing::debug;

use crate::backend::{EntryInfo, QueueKind};
use crate::{Result, Session};

/// One queue found by [`Session::queues`], with its entries in queue order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueInfo {
    /// The queue's name in the session's namespace: a lock's, an election's, a read-write
    /// lock's; for a semaphore `{name}/leases` (its permits) and `{name}/locks` (its gate).
    pub name: String,
    /// What the queue is, as far as the layout tells (etcd cannot tell an election from a
    /// lock: both are reported as locks there).
    pub kind: QueueKind,
    /// Every entry, in queue order: the holders first (one for a lock or an election; the
    /// readers ahead of the first writer; up to `n` permits), then the waiters.
    pub entries: Vec<EntryInfo>,
}

/// What [`Session::queue_listing`] found under a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QueueListing {
    /// The queues, in name order, as [`Session::queues`] returns them.
    pub queues: Vec<QueueInfo>,
    /// How many keys (ZooKeeper: nodes) of the namespace's listing map to no fencelock queue
    /// and were left out: ones another tool wrote under the namespace, whose path no valid
    /// name gives (an empty segment, such as `etcdctl lock {prefix}/`'s `{prefix}//{lease}`; a
    /// character or a segment the names refuse; an entry-shaped node right under the
    /// namespace). With a prefix, only keys that look like entries of a queue whose would-be
    /// name starts with the prefix are counted; keys that map to no queue at all are counted
    /// only in a listing without a prefix.
    /// Keys the backend does not list at all are not counted: keys that are not UTF-8, Redis
    /// keys that are not hashes, ZooKeeper nodes this client may not read.
    pub skipped: usize,
}

impl Session {
    /// Every queue under this session's namespace whose name starts with `prefix` (all with
    /// `""`), in name order, each with its entries in queue order: one listing of the
    /// namespace, then one read per queue. For operators' tools (`fencelock list`). Keys that
    /// other tools left under the namespace and that map to no fencelock name are skipped;
    /// [`queue_listing`](Self::queue_listing) also says how many. A prefix no name could start
    /// with (longer than any name, or with a control character) is an
    /// [`InvalidName`](crate::Error::InvalidName) error, not an empty listing.
    pub async fn queues(&self, prefix: &str) -> Result<Vec<QueueInfo>> {
        Ok(self.queue_listing(prefix).await?.queues)
    }

    /// [`queues`](Self::queues), with the number of keys it skipped because no fencelock
    /// name maps to them ([`QueueListing::skipped`]): a foreign key never fails the listing.
    pub async fn queue_listing(&self, prefix: &str) -> Result<QueueListing> {
        crate::name::validate_prefix(prefix)?;
        let shared = self.shared();
        let keys = self.list_entries().await?;
        // Each queue found, with how many of the keys map to it (a map: a namespace may hold
        // 100,000 queues, which a search of a list made quadratic).
        let mut found: Vec<(String, QueueKind, usize)> = Vec::new();
        let mut index: HashMap<(String, QueueKind), usize> = HashMap::new();
        let mut skipped = 0;
        for key in &keys {
            match shared.backend.queue_of(&shared.namespace, key) {
                Some((name, kind)) if name.starts_with(prefix) => {
                    match index.get(&(name.clone(), kind)) {
                        Some(&i) => found[i].2 += 1,
                        None => {
                            index.insert((name.clone(), kind), found.len());
                            found.push((name, kind, 1));
                        }
                    }
                }
                Some(_) => {}
                None if prefix.is_empty() => {
                    debug!(%key, "skipped a key that is no fencelock entry");
                    skipped += 1;
                }
                None => {}
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        let mut queues = Vec::with_capacity(found.len());
        for (name, kind, n) in found {
            // A name no fencelock primitive could have (another tool's key): skipped, rather
            // than fail the listing of the whole namespace.
            let queue = match self.found_queue(&name, kind) {
                Ok(q) => q,
                Err(e) => {
                    debug!(%name, error = %e, keys = n, "skipped keys that map to no fencelock name");
                    skipped += n;
                    continue;
                }
            };
            let entries = shared.retry_read(|| shared.remote.inspect(&queue)).await?;
            if !entries.is_empty() {
                queues.push(QueueInfo {
                    name,
                    kind,
                    entries,
                });
            }
        }
        Ok(QueueListing { queues, skipped })
    }
}
