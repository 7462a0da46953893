//! The all-or-nothing enqueue of a multi-lock on etcd: one transaction creates an entry in
//! every queue, or none.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use fencelock::backend::{EnqueueRequest, Entry};
use fencelock::Result;

use super::restore_fence;
use crate::error::temporary;
use crate::fence::{fence_key, FENCE_TRIES};
use crate::layout::{entry_of, key_of, prefix_of, queue_order};
use crate::lifecycle::{gets, keys_only, queue_keys, EtcdSession};

/// How often [`enqueue_all`] tries again when a queue's prefix changed between its read and
/// its write, though no entry of the queue itself appeared (a foreign entry ends it at once:
/// taken). Such a change is a lock nested under the name (`a/b` under `a`) coming or going:
/// the compare covers the whole prefix, and each of that lock's acquisitions failed a try
/// (three tries reported a free set taken, under a busy nested lock). Not more: each try
/// reads the whole prefix, nested locks included.
const ENQUEUE_ALL_TRIES: usize = 12;

pub(crate) async fn enqueue_all(
    session: &EtcdSession,
    reqs: &[EnqueueRequest<'_>],
) -> Result<Option<Vec<Entry>>> {
    let keys: Vec<String> = reqs
        .iter()
        .map(|r| key_of(r.queue, session.lease, r.kind, r.attempt))
        .collect();
    let prefixes: Vec<String> = reqs.iter().map(|r| prefix_of(r.queue)).collect();
    let puts: Vec<TxnOp> = reqs
        .iter()
        .zip(&keys)
        .map(|(r, k)| session.put(k, r.value))
        .collect();
    let own_reads: Vec<TxnOp> = keys
        .iter()
        .map(|k| TxnOp::get(k.as_str(), Some(keys_only())))
        .collect();
    let queue_reads: Vec<TxnOp> = prefixes
        .iter()
        .map(|p| TxnOp::get(p.as_str(), Some(queue_keys())))
        .collect();
    // The fences of the queues' namespaces (see `fence.rs`), read back when a txn fails.
    let mut namespaces: Vec<&str> = reqs.iter().map(|r| r.queue.namespace.as_str()).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let fence_reads: Vec<TxnOp> = namespaces
        .iter()
        .map(|ns| TxnOp::get(fence_key(ns, session.lease), Some(keys_only())))
        .collect();
    // First: every queue empty (a range compare: no key under the prefix) → create all.
    // Then (`second`): nothing under any prefix changed since the read that found only our
    // own entries → create what is missing.
    let empty: Vec<Compare> = prefixes
        .iter()
        .map(|p| Compare::create_revision(p.as_str(), CompareOp::Equal, 0).with_prefix())
        .collect();
    let mut second: Option<(Vec<Compare>, Vec<TxnOp>)> = None;
    let (mut tries, mut fence_tries) = (0, 0);
    while tries < ENQUEUE_ALL_TRIES {
        let (fences, sent): (Vec<Compare>, Vec<i64>) = namespaces
            .iter()
            .map(|ns| {
                let (compare, _, rev) = session.fence.compare(ns, session.lease);
                (compare, rev)
            })
            .unzip();
        let (compares, writes) = match &second {
            None => (empty.clone(), puts.clone()),
            Some((unchanged, creates)) => (unchanged.clone(), creates.clone()),
        };
        let txn = Txn::new()
            .when([compares, fences].concat())
            .and_then([writes, own_reads.clone()].concat())
            .or_else([queue_reads.clone(), fence_reads.clone()].concat());
        let resp = match session.txn("enqueue all", txn).await {
            Ok(resp) => resp,
            Err(e) => {
                // Unanswered: its creates may still be applied, later than their removal.
                for (req, key) in reqs.iter().zip(&keys) {
                    session.fence.unanswered(&req.queue.namespace, key);
                }
                return Err(e);
            }
        };
        let reads = gets(&resp);
        if resp.succeeded() {
            let entries = reads
                .iter()
                .zip(keys.iter().zip(reqs))
                .map(|(kvs, (k, r))| {
                    kvs.first()
                        .map(|kv| entry_of(k.clone(), r.kind, kv.create_revision()))
                        // Deleted meanwhile by someone else: tried again (not
                        // `SessionLost`, the cluster's word that the session ended).
                        .ok_or_else(|| {
                            temporary(
                                "enqueue all",
                                "an entry vanished between its create and its read",
                            )
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(Some(entries));
        }
        let (queues, fenced) = reads.split_at(reads.len().min(queue_reads.len()));
        let mut moved = false;
        for ((ns, sent), kvs) in namespaces.iter().zip(sent).zip(fenced) {
            if session.fence.moved(ns, session.lease, sent, kvs) {
                moved = true;
                if session.fence.gone(ns, sent) {
                    restore_fence(session, ns).await?;
                }
            }
        }
        if moved {
            // The same txn again, expecting the fences where they now are.
            fence_tries += 1;
            if fence_tries >= FENCE_TRIES {
                return Err(temporary(
                    "enqueue all",
                    "the session's create fence kept moving",
                ));
            }
            continue;
        }
        tries += 1;
        // A prefix was not empty: taken, unless all it holds is our own entry (a retry) or
        // deeper keys of other locks (`a/b/…` under `a/`).
        let mut must_create = Vec::new();
        for (((kvs, prefix), (key, put)), req) in queues
            .iter()
            .zip(&prefixes)
            .zip(keys.iter().zip(&puts))
            .zip(reqs)
        {
            let direct = queue_order(req.queue, prefix, kvs);
            if direct.iter().any(|(kv, _)| kv.key() != key.as_bytes()) {
                return Ok(None);
            }
            if direct.is_empty() {
                must_create.push(put.clone());
            }
        }
        let read_at = resp.header().map_or(0, |h| h.revision());
        let unchanged: Vec<Compare> = prefixes
            .iter()
            .map(|p| Compare::mod_revision(p.as_str(), CompareOp::Less, read_at + 1).with_prefix())
            .collect();
        second = Some((unchanged, must_create));
    }
    Ok(None)
}
