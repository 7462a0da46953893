//! The key layout of a queue (etcd's Go `concurrency` layout).

use etcd_client::KeyValue;
use fencelock::backend::{Entry, QueueId};
use fencelock::FencingToken;

/// `{namespace}/{name}/`: every entry of the queue is `{prefix}{lease hex}`.
pub(crate) fn prefix_of(queue: &QueueId) -> String {
    format!("{}/", queue.path())
}

/// The keys directly in the queue (`{prefix}{lease}`), skipping deeper keys of other locks
/// whose name extends this one (`a` versus `a/b`).
pub(crate) fn direct_children<'a>(
    prefix: &'a str,
    kvs: &'a [KeyValue],
) -> impl Iterator<Item = &'a KeyValue> + 'a {
    kvs.iter().filter(move |kv| {
        kv.key()
            .strip_prefix(prefix.as_bytes())
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
    })
}

/// An entry from its key and create revision (both the token and the queue order).
pub(crate) fn entry_of(key: String, create_revision: i64) -> Entry {
    Entry {
        key,
        token: FencingToken::new(create_revision as u64),
        order: create_revision as u64,
    }
}
