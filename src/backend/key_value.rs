//! The key layout of etcd's Go recipes (`concurrency` and `contrib/recipes`), which the
//! key-value backends share (etcd's keys, Redis's entry names, the memory backend's keys) so
//! that inspection and [`Session::queues`](crate::Session::queues) read alike everywhere:
//! written once here, in both directions.
//!
//! | queue | entry key |
//! |---|---|
//! | mutex, election | `{namespace}/{name}/{owner}` |
//! | read-write lock | `{namespace}/{name}/read/{owner}_{attempt}`, `…/write/{owner}_{attempt}` |
//! | semaphore leases | `{namespace}/{name}/leases/{owner}_{attempt}` |
//!
//! A mutex key is derived from the session alone (one entry per session and lock, as Go's
//! `Mutex`); readers, writers and permits add the attempt, since a session may hold several.

use uuid::Uuid;

use super::{EntryKind, QueueId, QueueKind};

/// The key of the `kind` entry that attempt `attempt` of session `owner` makes in `queue`:
/// `owner` is the session as the backend names it (etcd: its lease in hex).
///
/// ```
/// use fencelock::backend::{key_value_entry_key, EntryKind, QueueId, QueueKind};
/// let q = QueueId::new("ns", "jobs", QueueKind::Lock);
/// assert_eq!(key_value_entry_key(&q, "1f", EntryKind::Exclusive, uuid::Uuid::nil()), "ns/jobs/1f");
/// ```
pub fn key_value_entry_key(queue: &QueueId, owner: &str, kind: EntryKind, attempt: Uuid) -> String {
    // Concatenated, not `format!`ed: made on every acquisition (callgrind: `format!` cost
    // about 1,400 instructions a call here).
    let role = match (queue.kind, kind) {
        (QueueKind::ReadWrite, EntryKind::Shared) => "/read/",
        (QueueKind::ReadWrite, _) => "/write/",
        _ => "/",
    };
    let mut key = [
        queue.namespace.as_str(),
        "/",
        queue.name.as_str(),
        role,
        owner,
    ]
    .concat();
    if let QueueKind::ReadWrite | QueueKind::Semaphore = queue.kind {
        key.push('_');
        key.push_str(attempt.simple().encode_lower(&mut Uuid::encode_buffer()));
    }
    key
}

/// [`Backend::queue_of`](super::Backend::queue_of) for the key layout of etcd's Go recipes, which the etcd and memory
/// backends share: `{namespace}/{name}/{session}` (a lock or an election: the two cannot be told
/// apart, and read alike; reported as [`QueueKind::Lock`]), `{namespace}/{name}/read/{…}` and
/// `…/write/{…}` (a read-write lock), `{namespace}/{name}/{session}_{attempt}` (a semaphore's
/// leases).
pub fn key_value_queue_of(namespace: &str, key: &str) -> Option<(String, QueueKind)> {
    let rest = key.strip_prefix(namespace)?.strip_prefix('/')?;
    let (parent, leaf) = rest.rsplit_once('/')?;
    if parent.is_empty() || leaf.is_empty() {
        return None;
    }
    for role in ["/read", "/write"] {
        if let Some(name) = parent.strip_suffix(role).filter(|n| !n.is_empty()) {
            return Some((name.to_string(), QueueKind::ReadWrite));
        }
    }
    let kind = if leaf.contains('_') {
        QueueKind::Semaphore
    } else {
        QueueKind::Lock
    };
    Some((parent.to_string(), kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Uuid = Uuid::from_u128(0xab);
    const ID: &str = "000000000000000000000000000000ab";

    #[test]
    fn keys() {
        let ex = EntryKind::Exclusive;
        let q = QueueId::new("ns", "jobs/reindex", QueueKind::Lock);
        assert_eq!(
            key_value_entry_key(&q, "694d7b1f2a", ex, A),
            "ns/jobs/reindex/694d7b1f2a"
        );
        let root = QueueId::new("", "a", QueueKind::Election);
        assert_eq!(key_value_entry_key(&root, "a", ex, A), "/a/a");
        let rw = QueueId::new("ns", "cfg", QueueKind::ReadWrite);
        assert_eq!(
            key_value_entry_key(&rw, "a", EntryKind::Shared, A),
            format!("ns/cfg/read/a_{ID}")
        );
        assert_eq!(
            key_value_entry_key(&rw, "a", ex, A),
            format!("ns/cfg/write/a_{ID}")
        );
        let sem = QueueId::new("ns", "pool/leases", QueueKind::Semaphore);
        assert_eq!(
            key_value_entry_key(&sem, "a", EntryKind::Shared, A),
            format!("ns/pool/leases/a_{ID}")
        );
    }

    #[test]
    fn keys_read_back_as_their_queues() {
        let cases = [
            (QueueKind::Lock, EntryKind::Exclusive, QueueKind::Lock),
            (QueueKind::Election, EntryKind::Exclusive, QueueKind::Lock),
            (
                QueueKind::ReadWrite,
                EntryKind::Shared,
                QueueKind::ReadWrite,
            ),
            (
                QueueKind::ReadWrite,
                EntryKind::Exclusive,
                QueueKind::ReadWrite,
            ),
            (
                QueueKind::Semaphore,
                EntryKind::Shared,
                QueueKind::Semaphore,
            ),
        ];
        for (kind, entry, read) in cases {
            let q = QueueId::new("ns", "a/b", kind);
            let key = key_value_entry_key(&q, "1f", entry, A);
            assert_eq!(
                key_value_queue_of("ns", &key),
                Some(("a/b".to_string(), read)),
                "{key}"
            );
        }
        assert_eq!(key_value_queue_of("ns", "other/a/1f"), None);
    }
}
