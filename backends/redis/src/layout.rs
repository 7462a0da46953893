//! Where a session, a queue and an entry live in Redis.
//!
//! | what | Redis key | type |
//! |---|---|---|
//! | session `{sid}` alive, and what it owns | `fencelock:s:{sid}` | hash: `v` the version of what it owns, and a field `1` per entry it owns (named by the entry); `PX` = the session TTL |
//! | queue `{namespace}/{name}` (a mutex, an election: one queue, as on etcd; a semaphore's `{name}/leases`) | `fencelock:q:{namespace}/{name}` | sorted set: entry name → token; `PX` = 60 session TTLs past its members' last renewal |
//! | read-write lock `{namespace}/{name}` | `fencelock:q:{namespace}/{name}//rw` | sorted set, likewise |
//! | entry `{entry}` | `fencelock:e:{entry}` | hash: `q` queue, `t` token, `s` session, `k` kind, `c` created (ms since the epoch, the creating client's clock), `v` value; `PX` = 60 session TTLs past its last renewal (live while its session's key is, on a cluster while that key lists it: see `scripts/session.rs`, `KEEP_ALIVE`) |
//! | the token counter | `fencelock:t` | integer, never expires |
//! | queue `{path}` had an entry dropped as expired (not by its owner) lately | `fencelock:x:{path}` | string `1`; `PX` 10 s (see `crate::expired`) |
//!
//! Session ids are random (128 bits, hex). One token counter serves every namespace: two
//! namespaces can name the same queue (`/svc` + `x` and `` + `svc/x`), whose order must be one.
//!
//! **On Redis Cluster** every key above carries a hash tag after the prefix,
//! `fencelock{G}:…`, where `G` (0 to [`GROUPS`] − 1) is the queue's *group*: a hash (64-bit
//! FNV-1a) of the queue's path (`{namespace}/{name}`, a semaphore's `{name}/leases`) modulo
//! [`GROUPS`]. A queue, its entries, its token counter `fencelock{G}:t`, and the keys of the
//! sessions that have entries in it are in one slot, so each operation is still one script
//! on one node. A session has a key in each group where it holds (or waits
//! for) something, made by its first enqueue there and let expire once it holds nothing there:
//! its heartbeat is one script per such group (at most [`GROUPS`] whatever the number of
//! locks; nothing at all when there is none), and it depends on the shards of those groups
//! alone.
//! The token counter is the group's: tokens grow per lock (and across the locks that share
//! its group), not across groups. Channels are the same as on one server (`PUBLISH` reaches
//! every node of a cluster).
//!
//! Entry *names* follow the shared key layout of etcd's recipes
//! ([`key_value_entry_key`](fencelock::backend::key_value_entry_key), `{sid}` as the owner), so that inspection and
//! `Session::queues` read alike on every backend.
//!
//! Pub/sub channels: `fencelock:c:{entry}` gets a message when the entry is deleted or its
//! value changes (the owner listens, and the one waiter behind it at the session's first wait:
//! no herd); `fencelock:w:{sid}`, session `sid`'s own, names the session's entry right behind a
//! deleted one (every later wait of the session listens there, with no subscription of its
//! own);
//! `fencelock:h:{namespace}/{name}` when the queue's head changes (observers listen).

use fencelock::backend::{EntryKind, QueueId, QueueKind};

/// The prefix of every key and channel fencelock uses.
pub const KEY_PREFIX: &str = "fencelock";

/// How many groups the queues of a Redis Cluster are spread over (see the module's docs).
pub const GROUPS: u64 = 1024;

/// Where the keys of a queue live: on one server every queue is in the one group (keys
/// `fencelock:…`); on a cluster, in the group its path hashes to (keys `fencelock{G}:…`, one
/// slot). Named by the key of its token counter, which every script takes as `KEYS[1]` (its
/// keys' prefix, and the cluster's routing).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Group(String);

impl Group {
    /// The one group of a single server.
    pub(crate) fn single() -> Group {
        // Concatenated, not `format!`: made per request (callgrind: ~600 instructions less).
        Group([KEY_PREFIX, ":t"].concat())
    }

    /// The group of `path` on a cluster.
    pub(crate) fn hashed(path: &str) -> Group {
        // 64-bit FNV-1a: stable across processes and versions (every client must agree).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in path.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Group(format!("{KEY_PREFIX}{{{}}}:t", h % GROUPS))
    }

    /// The key of its token counter (`KEYS[1]` of every script).
    pub(crate) fn key(&self) -> &str {
        &self.0
    }

    /// The key of session `sid` in this group (`{prefix}:s:{sid}`).
    pub(crate) fn session_key(&self, sid: &str) -> String {
        let prefix = self.0.strip_suffix(":t").unwrap_or(&self.0);
        [prefix, ":s:", sid].concat()
    }
}

/// The groups of a deployment: one for a server, [`GROUPS`] for a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Groups {
    Single,
    Cluster,
}

impl Groups {
    /// The group of `queue`.
    pub(crate) fn of_queue(self, queue: &QueueId) -> Group {
        match self {
            // The path only where it is hashed.
            Groups::Single => Group::single(),
            Groups::Cluster => Group::hashed(&queue.path()),
        }
    }

    fn of_path(self, path: &str) -> Group {
        match self {
            Groups::Single => Group::single(),
            Groups::Cluster => Group::hashed(path),
        }
    }

    /// The group of the entry named `name` (names follow
    /// [`key_value_entry_key`](fencelock::backend::key_value_entry_key): the queue's path, then
    /// `/read` or `/write` for a read-write lock's, then the owner); `None` for a name that is
    /// no entry's.
    pub(crate) fn of_entry(self, name: &str) -> Option<Group> {
        if self == Groups::Single {
            return Some(Group::single());
        }
        let (parent, leaf) = name.rsplit_once('/')?;
        // A read-write lock's leaf is `{owner}_{attempt}`; a mutex's `{owner}` (hex, no `_`),
        // so a mutex named `x/read` keeps its whole path.
        let path = if leaf.contains('_') {
            parent
                .strip_suffix("/read")
                .or_else(|| parent.strip_suffix("/write"))
                .unwrap_or(parent)
        } else {
            parent
        };
        Some(self.of_path(path))
    }
}

/// On a Redis Cluster, the prefix of the keys of the entry named `name` (`fencelock{G}`: its
/// hash, its queue's sorted set `{prefix}:q:{path}`, its session's key `{prefix}:s:{sid}`), for
/// an operator who must reach under the layout; `None` for a name that is no entry's.
pub fn cluster_prefix(name: &str) -> Option<String> {
    let group = Groups::Cluster.of_entry(name)?;
    Some(group.key().trim_end_matches(":t").to_string())
}

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
/// characters of the namespace escaped (on a cluster, of every group).
pub(crate) fn entries_glob(groups: Groups, namespace: &str) -> String {
    let mut glob = match groups {
        Groups::Single => format!("{KEY_PREFIX}:e:"),
        Groups::Cluster => format!("{KEY_PREFIX}{{*}}:e:"),
    };
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

/// The prefix of a session's own channel, `fencelock:w:{sid}`.
pub(crate) const OWN_PREFIX: &str = "fencelock:w:";

/// Session `sid`'s own channel: a deletion names there the entry of the session right behind
/// the deleted one (`NAME TOKEN head|expired|ahead`), so that a waiter needs no subscription of its own.
pub(crate) fn chan_own(sid: &str) -> String {
    format!("{OWN_PREFIX}{sid}")
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
        assert_eq!(entries_glob(Groups::Single, "a*b"), "fencelock:e:a\\*b/*");
        assert_eq!(entries_glob(Groups::Single, ""), "fencelock:e:/*");
        assert_eq!(entries_glob(Groups::Cluster, "n"), "fencelock{*}:e:n/*");
    }

    #[test]
    fn groups() {
        use fencelock::backend::key_value_entry_key;
        use uuid::Uuid;
        assert_eq!(Group::single().key(), "fencelock:t");
        let g = Group::hashed("ns/jobs");
        assert!(g.key().starts_with("fencelock{") && g.key().ends_with("}:t"));
        // Every entry of a queue is in the queue's group, whatever the primitive.
        // (A semaphore's queue is always `{name}/leases`.)
        for (kind, names) in [
            (QueueKind::Lock, ["jobs", "jobs/read", "a/write/b"]),
            (QueueKind::ReadWrite, ["jobs", "jobs/read", "a/write/b"]),
            (
                QueueKind::Semaphore,
                ["p/leases", "read/leases", "a/write/leases"],
            ),
        ] {
            for name in names {
                let q = QueueId::new("ns", name, kind);
                for entry in [EntryKind::Exclusive, EntryKind::Shared] {
                    let e = key_value_entry_key(&q, "00ab", entry, Uuid::from_u128(7));
                    assert_eq!(
                        Groups::Cluster.of_entry(&e),
                        Some(Groups::Cluster.of_queue(&q)),
                        "{e}"
                    );
                }
            }
        }
        assert_eq!(Groups::Cluster.of_entry("nothing"), None);
        // Spread: 4,096 paths over the groups fill most of them.
        let used: std::collections::HashSet<_> = (0..4096)
            .map(|i| Group::hashed(&format!("ns/lock-{i}")))
            .collect();
        assert!(used.len() > 900, "{}", used.len());
    }
}
