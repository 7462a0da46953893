//! The node layout, Apache Curator compatible: pure functions and their tests.
//!
//! A queue `{namespace}/{name}` is the parent node `/{namespace}/{name}`; its entries are
//! ephemeral-sequential children `_c_{uuid}-{marker}{seq}`, ordered by the sequence suffix.
//!
//! | queue | marker | Curator recipe |
//! |---|---|---|
//! | mutex | `lock-` | `InterProcessMutex` (protected mode) |
//! | election | `latch-` | `LeaderLatch` |
//! | read-write lock | `__READ__` (reader), `__WRIT__` (writer) | `InterProcessReadWriteLock` |
//! | semaphore | `{name}/locks`: `lock-`; `{name}/leases`: `lease-` | `InterProcessSemaphoreV2` |
//!
//! Children without the `_c_{uuid}-` prefix (from a Curator client without protection) are
//! ordered with the others.

use fencelock::backend::{EntryKind, QueueId, QueueKind};
use fencelock::{Error, Result};
use uuid::Uuid;

/// Curator's protected-mode prefix: `_c_` + a UUID + `-`.
pub(crate) const PROTECTED_PREFIX: &str = "_c_";

/// Curator `InterProcessReadWriteLock`'s reader marker.
const READ: &str = "__READ__";
/// Curator `InterProcessReadWriteLock`'s writer marker.
const WRITE: &str = "__WRIT__";

/// Every marker any queue kind uses (to tell entries from other nodes).
const MARKERS: [&str; 5] = ["lock-", "latch-", READ, WRITE, "lease-"];

/// The node-name marker of an entry of `kind` in a queue of `queue` kind.
pub(crate) fn marker(queue: QueueKind, kind: EntryKind) -> &'static str {
    match (queue, kind) {
        (QueueKind::Election, _) => "latch-",
        (QueueKind::ReadWrite, EntryKind::Shared) => READ,
        (QueueKind::ReadWrite, _) => WRITE,
        (QueueKind::Semaphore, _) => "lease-",
        _ => "lock-",
    }
}

/// The markers of a queue kind's entries, with the kind each marks.
pub(crate) fn markers(queue: QueueKind) -> &'static [(&'static str, EntryKind)] {
    match queue {
        QueueKind::Election => &[("latch-", EntryKind::Exclusive)],
        QueueKind::ReadWrite => &[(READ, EntryKind::Shared), (WRITE, EntryKind::Exclusive)],
        QueueKind::Semaphore => &[("lease-", EntryKind::Shared)],
        _ => &[("lock-", EntryKind::Exclusive)],
    }
}

/// The sequence number of an entry called `name` with `marker`, if `name` is one:
/// `[_c_{uuid}-]{marker}{digits}`, in queue order.
///
/// The server numbers a parent's children with its child version, a 32-bit signed counter of
/// the creates and deletes under it, printed with at least ten characters: past 2^31 - 1 it
/// goes negative (`lock--2147483648`, `lock--000000005`). A hot lock whose parent never empties
/// gets there (about 12 days at 1,000 acquisitions a second): such names are read as the
/// counter's unsigned value, so they follow the last positive ones, as they were made (once the
/// counter comes back to zero, four billion changes later, entries that straddle that moment
/// are out of order). Before, they were not taken for entries at all: the acquisition that
/// made one never found it. (Curator sorts the names as text, which puts such names first:
/// in a queue shared with Curator clients the two disagree on the order while names of both
/// signs are in it; fencing by `czxid` still refuses the older holder's writes.)
pub(crate) fn sequence_of(name: &str, marker: &str) -> Option<u64> {
    // The digits run to the end of the name and the marker ends where they begin (no marker
    // holds a digit, so that is also its last occurrence). Checked from the end, without a
    // substring search: every path segment of every request goes through here, and most end
    // in a letter.
    let at = name.len() - name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (head, digits) = name.split_at(at);
    // A minus sign after the marker (which ends in `-` itself): a counter past 2^31 - 1.
    let (head, negative) = match head.strip_suffix('-') {
        Some(h) if h.ends_with(marker) => (h, true),
        _ => (head, false),
    };
    let prefix = head.strip_suffix(marker)?;
    if !(prefix.is_empty() || prefix.ends_with('-')) || digits.len() + usize::from(negative) < 10 {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    if negative {
        let below_zero = i32::try_from(value).ok().map(|v| -v).or_else(|| {
            // -2^31 itself, whose magnitude is no i32.
            (value == 1 << 31).then_some(i32::MIN)
        })?;
        return (below_zero < 0).then(|| u64::from(below_zero as u32));
    }
    Some(value)
}

/// Whether `name` is the name of a queue entry of any kind.
pub(crate) fn is_entry_name(name: &str) -> bool {
    MARKERS.iter().any(|m| sequence_of(name, m).is_some())
}

/// The queue of the entry node at `path` under the namespace root `root`: its name relative to
/// the root, and its kind (from the node's marker).
pub(crate) fn queue_of(root: &str, path: &str) -> Option<(String, QueueKind)> {
    let rest = if root == "/" {
        path.strip_prefix('/')?
    } else {
        path.strip_prefix(root)?.strip_prefix('/')?
    };
    let (name, node) = rest.rsplit_once('/')?;
    let kind = [
        QueueKind::Lock,
        QueueKind::Election,
        QueueKind::ReadWrite,
        QueueKind::Semaphore,
    ]
    .into_iter()
    .find(|&k| {
        markers(k)
            .iter()
            .any(|(m, _)| sequence_of(node, m).is_some())
    })?;
    (!name.is_empty()).then(|| (name.to_string(), kind))
}

/// One entry of a listing: its sequence, name and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) seq: u64,
    pub(crate) name: String,
    pub(crate) kind: EntryKind,
}

/// The entries of a `queue`-kind queue among `children`, in queue order.
pub(crate) fn sorted_entries(children: Vec<String>, queue: QueueKind) -> Vec<Listed> {
    let markers = markers(queue);
    let mut v: Vec<Listed> = children
        .into_iter()
        .filter_map(|name| {
            let (seq, kind) = markers
                .iter()
                .find_map(|(m, kind)| Some((sequence_of(&name, m)?, *kind)))?;
            Some(Listed { seq, name, kind })
        })
        .collect();
    v.sort_by(|a, b| (a.seq, &a.name).cmp(&(b.seq, &b.name)));
    v
}

/// The suffix of the node next to an election's parent that holds its leaders' proclaimed
/// values (see [`value_path`]); names ending with it are reserved.
pub(crate) const PROCLAIMED_SUFFIX: &str = ".proclaimed";

/// Whether `key` is an election candidate's node (`-latch-`).
pub(crate) fn is_latch(key: &str) -> bool {
    sequence_of(basename(key), "latch-").is_some()
}

/// Where the value a leader proclaimed after its campaign lives: `{parent}.proclaimed/{node}.value`
/// for the candidate node `{parent}/{node}`, outside the election's parent. A Curator
/// `LeaderLatch` queued behind a leader watches the leader's node with a one-shot watch and acts
/// only on its deletion: changing that node's data would use up the watch and strand the
/// Curator follower. So the node keeps its campaign value, and a new one goes here.
pub(crate) fn value_path(key: &str) -> Option<String> {
    let (parent, node) = key.rsplit_once('/')?;
    (!parent.is_empty()).then(|| format!("{parent}{PROCLAIMED_SUFFIX}/{node}.value"))
}

/// `parent/child`.
pub(crate) fn join(parent: &str, child: &str) -> String {
    // Concatenated, not `format!`ed: several per acquisition (callgrind: `format!` costs
    // about 1,400 instructions a call).
    if parent == "/" {
        ["/", child].concat()
    } else {
        [parent, "/", child].concat()
    }
}

/// The last segment of `path`.
pub(crate) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The name prefix of the entry of `attempt`; the server appends the sequence.
pub(crate) fn protected_name(attempt: Uuid, marker: &str) -> String {
    let mut buf = Uuid::encode_buffer();
    let uuid = attempt.hyphenated().encode_lower(&mut buf);
    [PROTECTED_PREFIX, uuid, "-", marker].concat()
}

/// Whether `name` is an entry created by `attempt` with `marker`.
pub(crate) fn is_attempt(name: &str, attempt: Uuid, marker: &str) -> bool {
    name.starts_with(&protected_name(attempt, marker)) && sequence_of(name, marker).is_some()
}

fn invalid(name: &str, reason: &'static str) -> Error {
    Error::invalid_name(name, reason)
}

/// Whether ZooKeeper accepts `c` in a path (`PathUtils.validatePath`: no control characters,
/// nothing in U+D800–U+F8FF or U+FFF0–U+FFFF, and so no character above U+FFFF, which Java
/// encodes as a surrogate pair).
fn zookeeper_accepts(c: char) -> bool {
    !(c.is_control()
        || ('\u{e000}'..='\u{f8ff}').contains(&c)
        || ('\u{fff0}'..='\u{ffff}').contains(&c)
        || c > '\u{ffff}')
}

/// Checks what ZooKeeper would refuse in `path` (absolute) beyond the core's name rules:
/// characters ZooKeeper rejects, the reserved top-level `zookeeper` node when there is no
/// chroot, and segments that look like queue entries (they would be mistaken for entries).
/// `shown` is the name reported in the error.
pub(crate) fn check_zk_path(path: &str, shown: &str, chrooted: bool) -> Result<()> {
    if !path.chars().all(zookeeper_accepts) {
        return Err(invalid(
            shown,
            "contains a character ZooKeeper rejects in paths (a control character, U+D800-U+F8FF, U+FFF0-U+FFFF, or any character above U+FFFF such as an emoji)",
        ));
    }
    let mut segments = path.split('/').skip(1);
    if !chrooted && segments.clone().next() == Some("zookeeper") {
        return Err(invalid(
            shown,
            "the top-level node /zookeeper is reserved by ZooKeeper",
        ));
    }
    for seg in &mut segments {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(invalid(shown, "contains an empty, '.' or '..' segment"));
        }
        if is_entry_name(seg) {
            return Err(invalid(
                shown,
                "a segment looks like a queue entry (lock-, latch-, lease-, __READ__ or __WRIT__ and a sequence number)",
            ));
        }
        if seg.ends_with(PROCLAIMED_SUFFIX) {
            return Err(invalid(
                shown,
                "a segment ending with .proclaimed is reserved (such nodes hold elections' proclaimed values)",
            ));
        }
    }
    Ok(())
}

/// The root node of `namespace`: `/{namespace}` (one leading '/' of the namespace stripped),
/// or `/` for the empty namespace.
pub(crate) fn namespace_root(namespace: &str, chrooted: bool) -> Result<String> {
    fencelock::validate_namespace(namespace)?;
    let ns = namespace.strip_prefix('/').unwrap_or(namespace);
    if ns.is_empty() {
        return Ok("/".to_string());
    }
    let root = format!("/{ns}");
    check_zk_path(&root, namespace, chrooted)?;
    Ok(root)
}

/// The parent node of a queue called `name` in `namespace`: `/{namespace}/{name}`, or
/// `/{name}` for the empty namespace.
pub(crate) fn queue_path_of(namespace: &str, name: &str, chrooted: bool) -> Result<String> {
    // Not `fencelock::validate_name`: the core has checked the user's name already, and a
    // primitive made of several queues (a semaphore's `{name}/locks`, `{name}/leases`) appends a
    // suffix that may take the queue's name past `MAX_NAME_LEN`, which ZooKeeper does not limit.
    // What ZooKeeper itself refuses is checked below, on the whole path.
    if name.is_empty() {
        return Err(invalid(name, "empty"));
    }
    // One string, checked in two parts: the namespace's (as `namespace_root` checks it) and
    // the name's (made on every acquisition: no root string of its own).
    fencelock::validate_namespace(namespace)?;
    let ns = namespace.strip_prefix('/').unwrap_or(namespace);
    if ns.is_empty() {
        let path = ["/", name].concat();
        check_zk_path(&path, name, chrooted)?;
        return Ok(path);
    }
    let path = ["/", ns, "/", name].concat();
    let (root, rest) = path.split_at(1 + ns.len());
    check_zk_path(root, namespace, chrooted)?;
    // The name's first segment is not top-level (so not the reserved `/zookeeper`: `true`).
    check_zk_path(rest, name, true)?;
    Ok(path)
}

/// The parent node of `queue`.
pub(crate) fn queue_path(queue: &QueueId, chrooted: bool) -> Result<String> {
    queue_path_of(&queue.namespace, &queue.name, chrooted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(ns: &str, name: &str) -> QueueId {
        QueueId::new(ns, name, QueueKind::Lock)
    }

    #[test]
    fn protected_names_are_curators() {
        let attempt = Uuid::parse_str("0f2a8f8e-9d2c-4e0e-8a50-0b1f5b3c1e2d").unwrap();
        assert_eq!(
            protected_name(attempt, "lock-"),
            "_c_0f2a8f8e-9d2c-4e0e-8a50-0b1f5b3c1e2d-lock-"
        );
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/ns", "a"), "/ns/a");
    }

    #[test]
    fn sequences() {
        let u = "_c_0f2a8f8e-9d2c-4e0e-8a50-0b1f5b3c1e2d-lock-0000000042";
        assert_eq!(sequence_of(u, "lock-"), Some(42));
        assert_eq!(sequence_of(u, "latch-"), None);
        assert_eq!(sequence_of("lock-0000000007", "lock-"), Some(7));
        assert_eq!(sequence_of("latch-0000000007", "latch-"), Some(7));
        assert_eq!(sequence_of("xlock-0000000007", "lock-"), None);
        assert_eq!(sequence_of("lock-12", "lock-"), None);
        assert_eq!(sequence_of("lock-00000000a1", "lock-"), None);
        assert_eq!(sequence_of("lock-0000000000000000042", "lock-"), Some(42));
        assert_eq!(sequence_of("lock-lock-0000000007", "lock-"), Some(7));
        assert_eq!(sequence_of("a-lock-0000000007", "lock-"), Some(7));
        assert_eq!(sequence_of("alock-0000000007", "lock-"), None);
        assert_eq!(sequence_of("lock-0000000042x", "lock-"), None);
        assert_eq!(sequence_of("0000000042", "lock-"), None);
        assert_eq!(sequence_of("", "lock-"), None);
        // Past 2^31 - 1 the server's counter prints negative: after the last positive ones.
        let last = sequence_of("lock-2147483647", "lock-").unwrap();
        let wrapped = sequence_of("lock--2147483648", "lock-").unwrap();
        assert_eq!(wrapped, 1 << 31);
        assert!(wrapped > last);
        assert_eq!(sequence_of(&format!("{u}-"), "lock-"), None);
        assert_eq!(
            sequence_of("_c_x-lock--000000005", "lock-"),
            Some((1 << 32) - 5)
        );
        assert_eq!(sequence_of("lock--000000001", "lock-"), Some((1 << 32) - 1));
        assert_eq!(sequence_of("lock--00000001", "lock-"), None, "too short");
        assert_eq!(sequence_of("lock--0000000000", "lock-"), None, "minus zero");
        assert_eq!(sequence_of("lock--2147483649", "lock-"), None, "below i32");
        assert_eq!(sequence_of("lock---000000005", "lock-"), None);
        assert_eq!(sequence_of("latch--000000005", "lock-"), None);
        assert_eq!(sequence_of("__READ__0000000003", READ), Some(3));
        assert!(!is_entry_name("bench") && !is_entry_name("contended"));
        let sorted = sorted_entries(
            vec![
                "_c_b-lock-0000000003".into(),
                "lock-0000000001".into(),
                "other".into(),
                "_c_a-latch-0000000000".into(),
                "_c_a-lock-0000000002".into(),
            ],
            QueueKind::Lock,
        );
        let names: Vec<_> = sorted.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "lock-0000000001",
                "_c_a-lock-0000000002",
                "_c_b-lock-0000000003"
            ]
        );
        let rw = sorted_entries(
            vec![
                "_c_b-__WRIT__0000000003".into(),
                "__READ__0000000001".into(),
                "_c_a-lock-0000000000".into(),
                "_c_a-__READ__0000000002".into(),
            ],
            QueueKind::ReadWrite,
        );
        let kinds: Vec<_> = rw.iter().map(|l| (l.seq, l.kind)).collect();
        assert_eq!(
            kinds,
            [
                (1, EntryKind::Shared),
                (2, EntryKind::Shared),
                (3, EntryKind::Exclusive)
            ]
        );
        let sem = sorted_entries(
            vec![
                "_c_b-lease-0000000003".into(),
                "_c_a-lock-0000000000".into(),
            ],
            QueueKind::Semaphore,
        );
        assert_eq!(sem.len(), 1);
        assert_eq!(marker(QueueKind::ReadWrite, EntryKind::Shared), "__READ__");
        assert_eq!(
            marker(QueueKind::ReadWrite, EntryKind::Exclusive),
            "__WRIT__"
        );
        assert!(is_entry_name("_c_x-__WRIT__0000000009"));
        let attempt = Uuid::nil();
        let name = format!("{}0000000005", protected_name(attempt, "lock-"));
        assert!(is_attempt(&name, attempt, "lock-"));
        assert!(!is_attempt(&name, Uuid::max(), "lock-"));
        assert!(!is_attempt(&name, attempt, "latch-"));
    }

    #[test]
    fn paths() {
        assert_eq!(
            queue_path(&q("fencelock", "a/b"), false).unwrap(),
            "/fencelock/a/b"
        );
        assert_eq!(
            queue_path(&q("/svc/locks", "a"), false).unwrap(),
            "/svc/locks/a"
        );
        assert_eq!(queue_path(&q("", "a"), false).unwrap(), "/a");
        assert!(queue_path(&q("", "zookeeper"), false).is_err());
        assert!(queue_path(&q("", "zookeeper/x"), false).is_err());
        assert!(queue_path(&q("", "zookeeper"), true).is_ok());
        assert!(queue_path(&q("/zookeeper", "x"), false).is_err());
        assert!(queue_path(&q("ns", "zookeeper"), false).is_ok());
        assert!(queue_path(&q("ns", "a\u{e000}"), false).is_err());
        assert!(queue_path(&q("ns", "a\u{fff5}"), false).is_err());
        assert!(queue_path(&q("ns", "emoji-\u{1f512}"), false).is_err());
        assert!(queue_path(&q("ns", "cjk-ext-b-\u{20000}"), false).is_err());
        assert!(queue_path(&q("ns", "é-中文"), false).is_ok());
        assert!(queue_path(&q("ns", "x/lock-0000000001"), false).is_err());
        assert!(queue_path(&q("ns", "x/__READ__0000000001"), false).is_err());
        assert_eq!(namespace_root("", false).unwrap(), "/");
        assert_eq!(namespace_root("/a/b", false).unwrap(), "/a/b");
        assert!(namespace_root("zookeeper", false).is_err());
        assert!(queue_path(&q("ns", "x.proclaimed"), false).is_err());
        assert_eq!(
            value_path("/ns/e/_c_x-latch-0000000001").as_deref(),
            Some("/ns/e.proclaimed/_c_x-latch-0000000001.value")
        );
        assert!(is_latch("/ns/e/_c_x-latch-0000000001"));
        assert!(!is_latch("/ns/e/_c_x-lock-0000000001"));
        assert_eq!(
            queue_of("/ns", "/ns/a/b/_c_x-__WRIT__0000000001"),
            Some(("a/b".to_string(), QueueKind::ReadWrite))
        );
        assert_eq!(
            queue_of("/", "/e/_c_x-latch-0000000001"),
            Some(("e".to_string(), QueueKind::Election))
        );
        assert_eq!(queue_of("/ns", "/other/a/lock-0000000001"), None);
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }
}
