//! The queue operations of an etcd session: enqueue (one or several queues at once), wait for
//! the entries ahead, re-read them, remove or abandon an entry, set its value.

use std::sync::atomic::{AtomicUsize, Ordering};

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp};
use fencelock::backend::{
    Ahead, BackendSession, EnqueueRequest, Enqueued, Entry, EntryKind, Peer, QueueId,
};
use fencelock::{Error, Result, SessionEnd};
use uuid::Uuid;

use crate::error::temporary;
use crate::fence::FENCE_TRIES;
use crate::layout::{ahead_range, entry_of, key_of, peer_of, prefix_of, queue_order};
use crate::lifecycle::{gets, keys_only, queue_keys, same, EtcdSession};
use crate::request::hedged;

mod all;
pub(crate) use all::enqueue_all;

pub(crate) async fn enqueue(session: &EtcdSession, req: EnqueueRequest<'_>) -> Result<Enqueued> {
    let key = key_of(req.queue, session.lease, req.kind, req.attempt);
    let prefix = prefix_of(req.queue);
    let Ahead { kind, nearest } = req.ahead;
    // The queue read: only the newest entries when the caller needs only the nearest
    // (ours is the newest of the queue right after its create, in the same txn), so that
    // the reply does not grow with the queue.
    let limited = nearest < usize::MAX;
    let limit = nearest.saturating_add(1);
    let range = ahead_range(req.queue, kind);
    let queue_read = if limited {
        GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX))
    } else {
        queue_keys()
    };
    let own_read = TxnOp::get(key.as_str(), Some(keys_only()));
    let queue_read = TxnOp::get(range.as_str(), Some(queue_read));
    let namespace = req.queue.namespace.as_str();
    // Create if absent (with our lease) and the fence is where we know it (see `fence.rs`),
    // else find it again: the key is derived from the lease, so a retry after a lost reply
    // finds our own entry. Either way, read the queue in the same round trip. A create's
    // revision is the txn's: no read of our own key.
    let mut tries = 0;
    let (resp, created) = loop {
        let (fenced, fence, sent) = session.fence.compare(namespace, session.lease);
        let fence_read = TxnOp::get(fence, Some(keys_only()));
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                fenced,
            ])
            .and_then([session.put(&key, req.value), queue_read.clone()])
            .or_else([own_read.clone(), queue_read.clone(), fence_read]);
        let resp = match session.txn("enqueue", txn).await {
            Ok(resp) => resp,
            Err(e) => {
                // Unanswered: it may still be applied, later than its removal.
                session.fence.unanswered(namespace, &key);
                return Err(e);
            }
        };
        if resp.succeeded() {
            break (resp, true);
        }
        let reads = gets(&resp);
        let own_found = reads.first().is_some_and(|own| !own.is_empty());
        tries += 1;
        if own_found
            || !session.fence.moved(
                namespace,
                session.lease,
                sent,
                reads.get(2).map_or(&[][..], Vec::as_slice),
            )
        {
            break (resp, false);
        }
        if session.fence.gone(namespace, sent) {
            restore_fence(session, namespace).await?;
        }
        if tries >= FENCE_TRIES {
            return Err(temporary(
                "enqueue",
                "the session's create fence kept moving",
            ));
        }
    };
    let mut reads = gets(&resp).into_iter();
    let own_rev = if created {
        resp.header().map(|h| h.revision())
    } else {
        reads
            .next()
            .and_then(|own| own.first().map(KeyValue::create_revision))
    };
    let Some(own_rev) = own_rev else {
        // A retry that finds nothing (deleted meanwhile by someone else): tried again, when a
        // put with a dead lease says whether the session is gone. (Not `SessionLost`: the
        // core takes that for the cluster's word that the session ended.)
        return Err(temporary(
            "enqueue",
            "our entry vanished between a create and its retry",
        ));
    };
    let queue = reads
        .next()
        .ok_or_else(|| temporary("enqueue", "unexpected txn reply"))?;
    let entry = entry_of(key, req.kind, own_rev);
    let mut ahead: Vec<Peer> = queue_order(req.queue, &prefix, &queue)
        .into_iter()
        .filter(|(kv, k)| {
            (kv.create_revision() as u64) < entry.order && kind.is_none_or(|want| *k == want)
        })
        .map(peer_of)
        .collect();
    // A limited read may not have reached far enough: our entry was found again rather
    // than created (newer entries came first), or keys of nested locks took up the limit.
    if limited && ahead.len() < nearest && (!created || queue.len() >= limit) {
        ahead = session
            .still_ahead(&entry, req.queue, kind, nearest)
            .await?;
    }
    Ok(Enqueued::new(entry, ahead))
}

/// Puts the fence key of `namespace` again (deleted by someone else after it was put), so
/// that the creates it fenced off stay fenced off.
async fn restore_fence(session: &EtcdSession, namespace: &str) -> Result<()> {
    let put = session.fence.put(namespace, session.lease);
    let resp = session.txn("fence", Txn::new().and_then([put])).await?;
    session.fence.moved_by(namespace, session.lease, &resp);
    Ok(())
}

/// How often a waiter looks again at a peer whose key it cannot watch by name (see [`wait`]).
const FOREIGN_KEY_POLL: std::time::Duration = std::time::Duration::from_millis(250);

pub(crate) async fn wait(session: &EtcdSession, own: &Entry, target: &Peer) -> Result<()> {
    // Watch the key from now, then read it in a txn that also confirms our own entry: no
    // deletion can slip between the two, and the read costs the same whatever the queue's
    // length (one key, never a range). A watch kept from the last wait on the same key that
    // covers the entry's whole life needs no read: its deletion, past or future, will be
    // delivered (the waiter's next read, after it, confirms our own entry).
    let reg = session
        .watcher
        .register(&target.key, target.order as i64)
        .await?;
    if reg.covered {
        let res = until_gone_or_vanished(session, own, reg.wait()).await;
        session.watcher.prune_if_large().await;
        return res;
    }
    let txn = Txn::new()
        .when([same(own)])
        .and_then([TxnOp::get(target.key.as_str(), Some(keys_only()))]);
    let resp = session.read_txn("wait", txn).await?;
    if !resp.succeeded() {
        return Err(Error::EntryVanished {
            key: own.key.clone(),
        });
    }
    let still_there = gets(&resp)
        .first()
        .and_then(|kvs| kvs.first().map(|kv| kv.create_revision() as u64))
        == Some(target.order);
    let res = if still_there {
        until_gone_or_vanished(session, own, reg.wait()).await
    } else {
        if target.key.contains(char::REPLACEMENT_CHARACTER) {
            // Most likely a key that is not UTF-8 (written by hand: ours and Go's are UTF-8),
            // read lossily: its name as read never exists, so the waiter, finding it gone at
            // once, would read the queue again and again without a pause. Look again after one.
            tokio::time::sleep(FOREIGN_KEY_POLL).await;
        }
        Ok(())
    };
    session.watcher.prune_if_large().await;
    res
}

/// Awaits `gone` (the key ahead deleted), looking at `own` now and then: a waiter watches
/// only the key ahead of it, so that an operator's delete of its own entry would be learnt
/// only at its turn (black-box: 7 s behind a holder of 8 s).
async fn until_gone_or_vanished(
    session: &EtcdSession,
    own: &Entry,
    gone: impl std::future::Future<Output = Result<()>>,
) -> Result<()> {
    fencelock_net::unless_own_vanishes(session.ttl, &own.key, gone, || exists(session, own)).await
}

/// Whether `own` still exists as the same entry (its key, created at its revision).
async fn exists(session: &EtcdSession, own: &Entry) -> Result<bool> {
    Ok(session.create_rev("check entry", &own.key).await? == Some(own.order))
}

pub(crate) async fn still_ahead(
    session: &EtcdSession,
    own: &Entry,
    queue: &QueueId,
    kind: Option<EntryKind>,
    nearest: usize,
) -> Result<Vec<Peer>> {
    // Go's `waitDeletes`: the last keys created before ours, by a range read limited to
    // what is needed, in a txn that also confirms our entry. Keys of other locks under the
    // prefix (`a/b/…` under `a/`) take up room in the limit: read more if they did.
    let prefix = prefix_of(queue);
    let range = ahead_range(queue, kind);
    let mut limit = nearest.max(1);
    loop {
        let options = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(own.order as i64 - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let txn = Txn::new()
            .when([same(own)])
            .and_then([TxnOp::get(range.as_str(), Some(options))]);
        let resp = session.read_txn("read queue", txn).await?;
        if !resp.succeeded() {
            return Err(Error::EntryVanished {
                key: own.key.clone(),
            });
        }
        let kvs = gets(&resp).into_iter().next().unwrap_or_default();
        let full = kvs.len() >= limit;
        let mut ahead: Vec<Peer> = queue_order(queue, &prefix, &kvs)
            .into_iter()
            .filter(|(_, k)| kind.is_none_or(|want| *k == want))
            .map(peer_of)
            .collect();
        if ahead.len() >= nearest || !full {
            let skip = ahead.len().saturating_sub(nearest);
            return Ok(ahead.split_off(skip));
        }
        limit = limit.saturating_mul(4);
    }
}

pub(crate) async fn wait_own_gone(session: &EtcdSession, own: &Entry) -> Result<()> {
    let reg = session.watcher.register(&own.key, own.order as i64).await?;
    let res = if exists(session, own).await? {
        reg.wait().await
    } else {
        Ok(())
    };
    session.watcher.prune_if_large().await;
    res?;
    lease_gone(session).await
}

/// After our entry went: `SessionLost(Expired)` if the session's lease went with it (revoked by
/// an operator, expired), which deletes every key attached to it, so that a holder's `lost()`
/// says why; a revoked lease read "our entry was deleted by someone else" (black-box round
/// 35). `Ok` if the lease lives, or cannot be read within the request bound (the deletion is
/// reported as it was). One question at a time, and a lease found alive less than
/// [`LEASE_SEEN_FOR`] ago is taken as alive: an operator's `del --prefix` under 100,000 held
/// guards awaiting `lost()` asks once, not 100,000 times.
async fn lease_gone(session: &EtcdSession) -> Result<()> {
    let mut seen = session.lease_seen.lock().await;
    if seen.is_some_and(|at| at.elapsed() < LEASE_SEEN_FOR) {
        return Ok(());
    }
    let mut lease = session.client.lease_client();
    let ask = lease.time_to_live(session.lease, None);
    match tokio::time::timeout(session.bound, ask).await {
        Ok(Ok(r)) if r.ttl() < 0 => Err(Error::SessionLost(SessionEnd::Expired)),
        Ok(Ok(_)) => {
            *seen = Some(std::time::Instant::now());
            Ok(())
        }
        _ => Ok(()),
    }
}

/// How long a lease found alive is taken as alive by [`lease_gone`].
const LEASE_SEEN_FOR: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) async fn remove(session: &EtcdSession, entry: &Entry) -> Result<bool> {
    let delete = TxnOp::delete(entry.key.as_str(), None);
    // A create of this key that went unanswered may still be applied: the fence moves with
    // the removal, whether or not the entry is still there (see `fence.rs`).
    let fence = session.fence.must_move(&entry.key);
    let txn = match &fence {
        None => Txn::new().when([same(entry)]).and_then([delete]),
        // Not the same entry any more (deleted by someone else): an unanswered create may
        // have made the key again meanwhile; read in the same txn, it is removed below.
        Some(namespace) => {
            let put = session.fence.put(namespace, session.lease);
            Txn::new()
                .when([same(entry)])
                .and_then([delete, put.clone()])
                .or_else([put, TxnOp::get(entry.key.as_str(), Some(keys_only()))])
        }
    };
    // Hedged although it writes: guarded by the entry's create revision, a copy can delete
    // only this entry, never one created later under the same key, so a late copy changes
    // nothing. (A release sent to a member that hangs held the lock for the whole request
    // bound, and its retry could meet the same member.) A copy that finds the entry gone
    // while another was sent most likely lost the race to it: removed by our own hand, as
    // the core also concludes when a retry after an unanswered try finds it gone. (Any
    // other: copies queued at a member that resumes from a pause are not applied in the
    // order they were sent, and the first one's "gone" was taken for someone else's
    // deletion, a command's exit 76 for a lock never lost.)
    let copies = AtomicUsize::new(0);
    let resp = hedged(session.bound, "release", || {
        let (mut kv, txn) = (session.client.kv_client(), txn.clone());
        copies.fetch_add(1, Ordering::Relaxed);
        async move { kv.txn(txn).await }
    })
    .await?;
    if let Some(namespace) = fence {
        session.fence.moved_by(&namespace, session.lease, &resp);
        session.fence.settled(&entry.key);
        // The key made again by a create served late: ours (derived from our lease, and the
        // caller holds the queue's local slot), and fenced now, so removed for good.
        let again = gets(&resp)
            .first()
            .and_then(|kvs| kvs.first().map(KeyValue::create_revision));
        if let Some(rev) = again.filter(|&rev| rev as u64 != entry.order) {
            Box::pin(remove(
                session,
                &entry_of(entry.key.clone(), entry.kind, rev),
            ))
            .await?;
        }
    }
    Ok(resp.succeeded() || copies.load(Ordering::Relaxed) > 1)
}

pub(crate) async fn abandon(
    session: &EtcdSession,
    queue: &QueueId,
    kind: EntryKind,
    attempt: Uuid,
) -> Result<()> {
    // The key is ours alone (derived from our lease, and the attempt where a session may
    // hold several entries) and the caller holds the session's local slot for this queue,
    // so whatever entry is there belongs to the abandoned attempt. Delete it guarded by its create revision, never unconditionally: a request
    // that reaches the cluster late (sent through a member that died, say) must not delete
    // an entry this session creates afterwards.
    let key = key_of(queue, session.lease, kind, attempt);
    let rev = match session.fence.must_move(&key) {
        // A create of it went unanswered: move the fence and read the key in one txn, so
        // that the create, applied before, is found, and applied after, fails.
        Some(namespace) => {
            let fence = session.fence.put(&namespace, session.lease);
            let txn = Txn::new().and_then([fence, TxnOp::get(key.as_str(), Some(keys_only()))]);
            let resp = session.txn("abandon", txn).await?;
            session.fence.moved_by(&namespace, session.lease, &resp);
            session.fence.settled(&key);
            gets(&resp)
                .first()
                .and_then(|kvs| kvs.first().map(|kv| kv.create_revision() as u64))
        }
        None => session.create_rev("abandon", &key).await?,
    };
    if let Some(rev) = rev {
        session.remove(&entry_of(key, kind, rev as i64)).await?;
    }
    Ok(())
}

/// Rewrites the entry's value, guarded by its mod revision as read just before as well as by
/// its create revision: a try of an earlier call held up on a member (one that paused, or a
/// link that delivered late) and applied after a later call's write fails, instead of bringing
/// the older value back (a leader's address, say) until the next `proclaim`. The value found
/// rewritten between the read and the write (by such a late try) is read and written again;
/// `false` once the entry is gone or another.
pub(crate) async fn set_value(session: &EtcdSession, entry: &Entry, value: &[u8]) -> Result<bool> {
    // Late tries are few (those of the calls before, each retried within its bound).
    const TRIES: usize = 3;
    let key = entry.key.as_str();
    let mut found = session
        .read_txn(
            "proclaim",
            Txn::new().and_then([TxnOp::get(key, Some(keys_only()))]),
        )
        .await
        .map(|resp| gets(&resp).concat())?;
    for _ in 0..TRIES {
        let Some(kv) = found
            .first()
            .filter(|kv| kv.create_revision() == entry.order as i64)
        else {
            return Ok(false);
        };
        let unchanged = Compare::mod_revision(key, CompareOp::Equal, kv.mod_revision());
        let txn = Txn::new()
            .when([same(entry), unchanged])
            .and_then([session.put(key, value)])
            .or_else([TxnOp::get(key, Some(keys_only()))]);
        let resp = session.txn("proclaim", txn).await?;
        if resp.succeeded() {
            return Ok(true);
        }
        found = gets(&resp).concat();
    }
    Err(temporary(
        "proclaim",
        "the value kept changing under the write",
    ))
}
