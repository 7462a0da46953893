//! Where a session, a queue and an entry live in Redis.
//!
//! | what | Redis key | type |
//! |---|---|---|
//! | session `{sid}` alive | `fencelock:s:{sid}` | hash: `v` the version of what it owns; `PX` = the session TTL |
//! | the entries session `{sid}` owns | `fencelock:o:{sid}` | set of entry names, `PX` likewise |
//! | queue `{namespace}/{name}` (a mutex, an election: one queue, as on etcd; a semaphore's `{name}/leases`) | `fencelock:q:{namespace}/{name}` | sorted set: entry name → token |
//! | read-write lock `{namespace}/{name}` | `fencelock:q:{namespace}/{name}//rw` | sorted set, likewise |
//! | entry `{entry}` | `fencelock:e:{entry}` | hash: `q` queue, `t` token, `s` session, `k` kind, `c` created (ms), `v` value |
//! | the token counter | `fencelock:t` | integer, never expires |
//!
//! Session ids are random (128 bits, hex). One token counter serves every namespace: two
//! namespaces can name the same queue (`/svc` + `x` and `` + `svc/x`), whose order must be one.
//!
//! Entry *names* follow the shared key layout of etcd's recipes
//! ([`key_value_entry_key`](fencelock::backend::key_value_entry_key), `{sid}` as the owner), so that inspection and
//! `Session::queues` read alike on every backend.
//!
//! Pub/sub channels: `fencelock:c:{entry}` gets a message when the entry is deleted or its
//! value changes (the one waiter behind it and the owner listen: no herd);
//! `fencelock:h:{namespace}/{name}` when the queue's head changes (observers listen).

use fencelock::backend::{EntryKind, QueueId, QueueKind};

/// The prefix of every key and channel fencelock uses.
pub const KEY_PREFIX: &str = "fencelock";

/// The kind as the scripts store it.
pub(crate) fn kind_code(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::Shared => "s",
        _ => "x",
    }
}

/// A kind filter as the scripts take it (`""`: any kind).
pub(crate) fn filter_code(kind: Option<EntryKind>) -> &'static str {
    kind.map_or("", kind_code)
}

/// The kind a script returned.
pub(crate) fn kind_of(code: &str) -> EntryKind {
    if code == "s" {
        EntryKind::Shared
    } else {
        EntryKind::Exclusive
    }
}

/// The glob that matches the entry hashes under `namespace`, with the glob's special
/// characters of the namespace escaped.
pub(crate) fn entries_glob(namespace: &str) -> String {
    let mut glob = format!("{KEY_PREFIX}:e:");
    for c in namespace.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            glob.push('\\');
        }
        glob.push(c);
    }
    glob.push_str("/*");
    glob
}

/// The channel that gets a message when entry `name` is deleted or its value changes.
pub(crate) fn chan_entry(name: &str) -> String {
    format!("{KEY_PREFIX}:c:{name}")
}

/// The channel that gets a message when the head of `queue` changes.
pub(crate) fn chan_head(queue: &QueueId) -> String {
    format!("{KEY_PREFIX}:h:{}", queue_path(queue))
}

/// The path that names `queue`'s sorted set (`fencelock:q:{path}`) and head channel: a
/// read-write lock's is `{namespace}/{name}//rw`, apart from the mutex and the election of the
/// same name (one queue, `{namespace}/{name}`, as on etcd), so that a read-write lock and a
/// mutex of one name are independent, as on etcd and ZooKeeper. `//` is in no valid path.
pub(crate) fn queue_path(queue: &QueueId) -> String {
    match queue.kind {
        QueueKind::ReadWrite => format!("{}//rw", queue.path()),
        _ => queue.path(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_escapes() {
        assert_eq!(entries_glob("a*b"), "fencelock:e:a\\*b/*");
        assert_eq!(entries_glob(""), "fencelock:e:/*");
    }
}
