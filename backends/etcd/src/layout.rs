//! The key layout of a queue, on etcd's Go layouts; the create revision is both the queue order
//! and the fencing token.
//!
//! | queue | entry key |
//! |---|---|
//! | mutex, election (Go `concurrency`) | `{namespace}/{name}/{lease hex}` |
//! | read-write lock (Go `contrib/recipes` `RWMutex`) | `{namespace}/{name}/read/{lease hex}_{attempt}`, `…/write/{lease hex}_{attempt}` |
//! | semaphore leases | `{namespace}/{name}/leases/{lease hex}_{attempt}` |
//!
//! A mutex key is derived from the lease alone (one entry per session and lock, as Go's
//! `Mutex`); readers, writers and permits add the attempt, since a session may hold several.
//! Go's `RWMutex` names its keys `…/read/{unix nanos}`: any key one level below `read/` or
//! `write/` is an entry, so the two interoperate.

use etcd_client::KeyValue;
use fencelock::backend::{key_value_entry_key, Entry, EntryKind, Peer, QueueId, QueueKind};
use fencelock::FencingToken;
use uuid::Uuid;

/// `{namespace}/{name}/`: every entry of the queue is below it.
pub(crate) fn prefix_of(queue: &QueueId) -> String {
    format!("{}/", queue.path())
}

/// The key of the entry of `kind` that attempt `attempt` of `lease` makes in `queue` (the
/// shared layout, the lease in hex as the owner).
pub(crate) fn key_of(queue: &QueueId, lease: i64, kind: EntryKind, attempt: Uuid) -> String {
    key_value_entry_key(queue, &format!("{lease:x}"), kind, attempt)
}

/// The key range holding the entries of `queue` of `kind` (all of them with `None`): a
/// read-write lock keeps readers and writers under `read/` and `write/`.
pub(crate) fn ahead_range(queue: &QueueId, kind: Option<EntryKind>) -> String {
    let prefix = prefix_of(queue);
    match (queue.kind, kind) {
        (QueueKind::ReadWrite, Some(EntryKind::Exclusive)) => format!("{prefix}write/"),
        (QueueKind::ReadWrite, Some(EntryKind::Shared)) => format!("{prefix}read/"),
        _ => prefix,
    }
}

/// The kind of the entry at `key` if it is an entry of the `kind` queue at `prefix`: a key
/// directly below the prefix, or (read-write locks) directly below `read/` or `write/`. Deeper
/// keys belong to other locks whose names extend this one (`a` versus `a/b`).
pub(crate) fn entry_kind(kind: QueueKind, prefix: &str, key: &[u8]) -> Option<EntryKind> {
    let rest = key.strip_prefix(prefix.as_bytes())?;
    let leaf = |id: &[u8]| !id.is_empty() && !id.contains(&b'/');
    match kind {
        QueueKind::ReadWrite => {
            if rest.strip_prefix(b"read/").is_some_and(leaf) {
                Some(EntryKind::Shared)
            } else if rest.strip_prefix(b"write/").is_some_and(leaf) {
                Some(EntryKind::Exclusive)
            } else {
                None
            }
        }
        QueueKind::Semaphore => leaf(rest).then_some(EntryKind::Shared),
        _ => leaf(rest).then_some(EntryKind::Exclusive),
    }
}

/// The entries of the `queue` among `kvs` (a range read of its prefix), in queue order (create
/// revision), with their kinds.
pub(crate) fn queue_order<'a>(
    queue: &QueueId,
    prefix: &str,
    kvs: &'a [KeyValue],
) -> Vec<(&'a KeyValue, EntryKind)> {
    let mut v: Vec<_> = kvs
        .iter()
        .filter_map(|kv| Some((kv, entry_kind(queue.kind, prefix, kv.key())?)))
        .collect();
    v.sort_by_key(|(kv, _)| kv.create_revision());
    v
}

/// A key as a string (keys we wrote are UTF-8; foreign ones are shown lossily).
pub(crate) fn key_string(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.key()).into_owned()
}

/// An entry from its key, kind and create revision (both the token and the queue order).
pub(crate) fn entry_of(key: String, kind: EntryKind, create_revision: i64) -> Entry {
    Entry {
        key,
        token: FencingToken::new(create_revision as u64),
        order: create_revision as u64,
        kind,
    }
}

/// A peer from a key-value read.
pub(crate) fn peer_of((kv, kind): (&KeyValue, EntryKind)) -> Peer {
    Peer {
        key: key_string(kv),
        order: kv.create_revision() as u64,
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Uuid = Uuid::from_u128(0xab);

    #[test]
    fn keys() {
        let q = QueueId::new("ns", "jobs/reindex", QueueKind::Lock);
        assert_eq!(prefix_of(&q), "ns/jobs/reindex/");
        let ex = EntryKind::Exclusive;
        assert_eq!(
            key_of(&q, 0x694d7b1f2a, ex, A),
            "ns/jobs/reindex/694d7b1f2a"
        );
    }

    #[test]
    fn entries_of_a_queue() {
        let lock = QueueKind::Lock;
        assert_eq!(
            entry_kind(lock, "ns/a/", b"ns/a/1f"),
            Some(EntryKind::Exclusive)
        );
        assert_eq!(entry_kind(lock, "ns/a/", b"ns/a/b/1f"), None);
        assert_eq!(entry_kind(lock, "ns/a/", b"ns/a/"), None);
        assert_eq!(entry_kind(lock, "ns/a/", b"ns/ab/1f"), None);
        let rw = QueueKind::ReadWrite;
        assert_eq!(
            entry_kind(rw, "ns/a/", b"ns/a/read/1"),
            Some(EntryKind::Shared)
        );
        assert_eq!(
            entry_kind(rw, "ns/a/", b"ns/a/write/1697000000000000000"),
            Some(EntryKind::Exclusive)
        );
        assert_eq!(entry_kind(rw, "ns/a/", b"ns/a/1f"), None);
        assert_eq!(entry_kind(rw, "ns/a/", b"ns/a/read/"), None);
        assert_eq!(entry_kind(rw, "ns/a/", b"ns/a/read/x/y"), None);
        let sem = QueueKind::Semaphore;
        assert_eq!(
            entry_kind(sem, "ns/a/", b"ns/a/1f_0a"),
            Some(EntryKind::Shared)
        );
    }
}
