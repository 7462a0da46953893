//! Inspection of a whole namespace: every queue with entries, who holds and who waits.

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

impl Session {
    /// Every queue under this session's namespace whose name starts with `prefix` (all with
    /// `""`), in name order, each with its entries in queue order: one listing of the
    /// namespace, then one read per queue. For operators' tools (`fencelock list`).
    pub async fn queues(&self, prefix: &str) -> Result<Vec<QueueInfo>> {
        let shared = self.shared();
        let keys = self.list_entries().await?;
        let mut found: Vec<(String, QueueKind)> = Vec::new();
        for key in &keys {
            if let Some(q) = shared.backend.queue_of(&shared.namespace, key) {
                if q.0.starts_with(prefix) && !found.contains(&q) {
                    found.push(q);
                }
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::with_capacity(found.len());
        for (name, kind) in found {
            let queue = self.found_queue(&name, kind)?;
            let entries = shared.retry(|| shared.remote.inspect(&queue)).await?;
            if !entries.is_empty() {
                out.push(QueueInfo {
                    name,
                    kind,
                    entries,
                });
            }
        }
        Ok(out)
    }
}
