//! Inspection (who holds, who waits) and revocation requests, on entry nodes.

use std::time::{Duration, SystemTime};

use fencelock::backend::{Entry, EntryInfo, QueueId, REVOKE_MARKER};
use fencelock::{Error, FencingToken, Result};
use zookeeper_client as zk;

use crate::error;
use crate::layout::{is_latch, join, queue_path, sorted_entries, value_path};
use crate::session::ZkSession;
use crate::watch::DataWatch;

/// How often a revocation request retries when the node's data changes under it.
const REVOKE_ATTEMPTS: usize = 5;

impl ZkSession {
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

    /// Writes [`REVOKE_MARKER`] into the node at `key` if it is still the entry with `token`
    /// (its czxid), as Curator's `Revoker` does: a conditional `setData` on the version just
    /// read, so that the request never lands on another node.
    pub(crate) async fn revoke_at(&self, key: &str, token: FencingToken) -> Result<bool> {
        const OP: &str = "request revoke";
        for _ in 0..REVOKE_ATTEMPTS {
            let client = self.client()?;
            let stat = match client.check_stat(key).await {
                Ok(Some(stat)) if stat.czxid as u64 == token.get() => stat,
                Ok(_) => return Ok(false),
                Err(e) => return Err(error::map(OP, e)),
            };
            match client
                .set_data(key, REVOKE_MARKER, Some(stat.version))
                .await
            {
                Ok(_) => return Ok(true),
                Err(zk::Error::NoNode) => return Ok(false),
                Err(zk::Error::BadVersion) => continue, // changed meanwhile: read again
                Err(e) => return Err(error::map(OP, e)),
            }
        }
        Err(Error::backend(
            error::NAME,
            OP,
            true,
            "the node's data kept changing",
        ))
    }

    /// Resolves once the data of `own` is [`REVOKE_MARKER`]; fails with `EntryVanished` once
    /// it is gone. One data watch on the node, re-armed after each change.
    pub(crate) async fn wait_revoked(&self, own: &Entry) -> Result<()> {
        // Our own node: a wait given up (a dropped `revoke_requested()`) removes its watch.
        let vanished = || Error::EntryVanished {
            key: own.key.clone(),
        };
        let w = DataWatch {
            op: "watch revoke",
            path: &own.key,
            own: None,
            gone: || Err(vanished()),
        };
        self.watch_data(w, |data, stat| {
            if stat.czxid as u64 != own.token.get() {
                Some(Err(vanished()))
            } else {
                (data == REVOKE_MARKER).then_some(Ok(()))
            }
        })
        .await
    }
}
