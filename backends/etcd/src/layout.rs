//! The key layout of a queue: etcd's Go `clientv3/concurrency` layout, `{namespace}/{name}/`
//! followed by the lease id in lowercase hex; the create revision is both the queue order and
//! the fencing token.

use etcd_client::KeyValue;
use fencelock::backend::{Entry, EntryKind, Peer, QueueId};
use fencelock::FencingToken;

/// `{namespace}/{name}/`: every entry of the queue is `{prefix}{lease hex}`.
pub(crate) fn prefix_of(queue: &QueueId) -> String {
    format!("{}/", queue.path())
}

/// The key of `lease`'s entry in `queue`.
pub(crate) fn key_of(queue: &QueueId, lease: i64) -> String {
    format!("{}{lease:x}", prefix_of(queue))
}

/// Whether `key` is directly in the queue at `prefix` (`{prefix}{lease}`), rather than a
/// deeper key of another lock whose name extends this one (`a` versus `a/b`).
pub(crate) fn is_direct_child(prefix: &str, key: &[u8]) -> bool {
    key.strip_prefix(prefix.as_bytes())
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
}

/// The entries directly in the queue at `prefix`, in queue order (create revision).
pub(crate) fn queue_order<'a>(prefix: &str, kvs: &'a [KeyValue]) -> Vec<&'a KeyValue> {
    let mut v: Vec<&KeyValue> = kvs
        .iter()
        .filter(|kv| is_direct_child(prefix, kv.key()))
        .collect();
    v.sort_by_key(|kv| kv.create_revision());
    v
}

/// A key as a string (keys we wrote are UTF-8; foreign ones are shown lossily).
pub(crate) fn key_string(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.key()).into_owned()
}

/// An entry from its key and create revision (both the token and the queue order).
pub(crate) fn entry_of(key: String, create_revision: i64) -> Entry {
    Entry {
        key,
        token: FencingToken::new(create_revision as u64),
        order: create_revision as u64,
        kind: EntryKind::Exclusive,
    }
}

/// A peer from a key-value read.
pub(crate) fn peer_of(kv: &KeyValue) -> Peer {
    Peer {
        key: key_string(kv),
        order: kv.create_revision() as u64,
        kind: EntryKind::Exclusive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock::backend::QueueKind;

    #[test]
    fn keys() {
        let q = QueueId::new("ns", "jobs/reindex", QueueKind::Lock);
        assert_eq!(prefix_of(&q), "ns/jobs/reindex/");
        assert_eq!(key_of(&q, 0x694d7b1f2a), "ns/jobs/reindex/694d7b1f2a");
        let root = QueueId::new("", "a", QueueKind::Election);
        assert_eq!(key_of(&root, 10), "/a/a");
        assert!(is_direct_child("ns/a/", b"ns/a/1f"));
        assert!(!is_direct_child("ns/a/", b"ns/a/b/1f"));
        assert!(!is_direct_child("ns/a/", b"ns/a/"));
        assert!(!is_direct_child("ns/a/", b"ns/ab/1f"));
    }
}
