//! The reads of an etcd session: a queue's head (and waiting for it to change), a queue's
//! entries with their values, and every key of a namespace.

use etcd_client::{GetOptions, SortOrder, SortTarget};
use fencelock::backend::{BackendSession, Entry, EntryInfo, QueueId};
use fencelock::{FencingToken, Result};

use crate::error::{map, temporary, watch_refused};
use crate::fence::is_fence_key;
use crate::layout::{entry_kind, entry_of, key_string, prefix_of, queue_order};
use crate::lifecycle::{queue_keys, EtcdSession};
use crate::request::{hedged, within};

/// How often [`head`] reads the queue again when the head it found went
/// before its value was read.
const HEAD_READS: usize = 10;

pub(crate) async fn head(
    session: &EtcdSession,
    queue: &QueueId,
) -> Result<Option<(Entry, Vec<u8>)>> {
    // The keys first, then the head's value alone: candidates' values may be up to 1 MB
    // each, and reading them all would cost the whole queue's values per read (and
    // overflow a reply's size limit with a few large ones).
    let prefix = prefix_of(queue);
    let options = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    for _ in 0..HEAD_READS {
        // Keys only, but every key under the prefix (nested names' too): past the client's
        // default 4 MiB a reply would be refused.
        let resp = hedged(session.bound, "leader", || {
            let mut kv = session.large_kv();
            let options = options.clone();
            let prefix = prefix.as_str();
            async move { kv.get(prefix, Some(options)).await }
        })
        .await?;
        let Some(&(kv, kind)) = queue_order(queue, &prefix, resp.kvs()).first() else {
            return Ok(None);
        };
        let entry = entry_of(key_string(kv), kind, kv.create_revision());
        // By the key's bytes: a foreign key that is not UTF-8 is read back as itself.
        let value = hedged(session.bound, "leader", || {
            let mut large = session.large_kv();
            async move { large.get(kv.key(), None).await }
        })
        .await?;
        // Still the same entry (else the head changed in between: read again).
        if let Some(kv) = value
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() as u64 == entry.order)
        {
            return Ok(Some((entry, kv.value().to_vec())));
        }
    }
    Err(temporary("leader", "the queue's head kept changing"))
}

/// Waits until the head of `queue` or its value differs from `seen`.
///
/// While a head is known, only its key is watched: it can change only by going (entries that
/// join take later revisions, behind it) or by a new value, so waiters joining and leaving
/// the queue's tail wake no observer. An empty queue is watched whole, for an entry's arrival
/// (the keys of nested names under its prefix do not count).
///
/// A quiet watch is asked for progress, and one that stays silent for the request bound ends
/// with a temporary error: a member that hangs keeps its streams open without a word, and the
/// caller reads again elsewhere (within about the bound, not HTTP/2 keep-alive's seconds).
pub(crate) async fn wait_queue_change(
    session: &EtcdSession,
    queue: &QueueId,
    seen: Option<&(Entry, Vec<u8>)>,
) -> Result<()> {
    let prefix = prefix_of(queue);
    let (key, options) = match seen {
        // (A head whose key is not UTF-8, a foreign one, is known only by a lossy copy of its
        // name, which a watch would never hear of: the queue is watched whole.)
        Some((head, _)) if !head.key.contains(char::REPLACEMENT_CHARACTER) => {
            (head.key.clone(), etcd_client::WatchOptions::new())
        }
        _ => (
            prefix.clone(),
            etcd_client::WatchOptions::new().with_prefix(),
        ),
    };
    // Opened and created within the request bound (a stream sent to a member that hangs
    // is given up, and the caller's retry goes elsewhere).
    let mut watches = session
        .client
        .watch_client()
        .max_decoding_message_size(usize::MAX);
    let opened = watches.watch(key.as_str(), Some(options));
    let mut stream = within(session.bound, "observe", opened).await?;
    match within(session.bound, "observe", stream.message()).await? {
        Some(r) if r.created() && !r.canceled() => {}
        Some(r) if r.canceled() => return Err(watch_refused(r.cancel_reason())),
        _ => return Err(temporary("observe", "watch was not created")),
    }
    let now = session.head(queue).await?;
    let same = match (&now, seen) {
        (None, None) => true,
        (Some((e, v)), Some((se, sv))) => e == se && v == sv,
        _ => false,
    };
    if !same {
        return Ok(());
    }
    let mut asked = false;
    loop {
        // Quiet for half the bound: ask; then silent for the bound: given up.
        let patience = if asked {
            session.bound
        } else {
            session.bound / 2
        };
        let message = match tokio::time::timeout(patience, stream.message()).await {
            Ok(m) => m.map_err(|e| map("observe", e))?,
            Err(_) if asked => {
                return Err(temporary("observe", "the watch stream went silent"));
            }
            Err(_) => {
                asked = true;
                within(session.bound, "observe", stream.request_progress()).await?;
                continue;
            }
        };
        asked = false;
        match message {
            Some(r) if r.canceled() => {
                return Err(temporary("observe", "watch canceled"));
            }
            Some(r) => {
                let counts = |ev: &etcd_client::Event| {
                    seen.is_some()
                        || ev
                            .kv()
                            .is_some_and(|kv| entry_kind(queue.kind, &prefix, kv.key()).is_some())
                };
                if r.events().iter().any(counts) {
                    return Ok(());
                }
            }
            None => return Err(temporary("observe", "watch ended")),
        }
    }
}

pub(crate) async fn inspect(session: &EtcdSession, queue: &QueueId) -> Result<Vec<EntryInfo>> {
    let prefix = prefix_of(queue);
    let mut large = session.large_kv();
    let get = large.get(prefix.as_str(), Some(GetOptions::new().with_prefix()));
    let resp = within(session.bound, "inspect", get).await?;
    Ok(queue_order(queue, &prefix, resp.kvs())
        .into_iter()
        .map(|(kv, kind)| {
            EntryInfo::new(
                key_string(kv),
                FencingToken::new(kv.create_revision() as u64),
                kind,
                format!("{:x}", kv.lease()),
                kv.value().to_vec(),
                // etcd records revisions, not times.
                None,
            )
        })
        .collect())
}

pub(crate) async fn list(session: &EtcdSession, namespace: &str) -> Result<Vec<String>> {
    // Every key of the namespace: 100,000 locks make more than the client's default 4 MiB.
    let mut kv = session.large_kv();
    let get = kv.get(format!("{namespace}/"), Some(queue_keys()));
    let resp = within(session.bound, "list", get).await?;
    // A foreign key that is not UTF-8 is left out (fencelock's names are UTF-8): shown
    // lossily it would pass for a queue that no read can find.
    // Sessions' create fences (`fence.rs`) are no entries.
    let mut keys: Vec<String> = resp
        .kvs()
        .iter()
        .filter_map(|kv| kv.key_str().ok().map(str::to_string))
        .filter(|k| !is_fence_key(namespace, k))
        .collect();
    keys.sort();
    Ok(keys)
}
