//! The queue layout (Apache Curator compatible) and the queue operations of a session.
//!
//! A queue `{namespace}/{name}` is the parent node `/{namespace}/{name}`; its entries are
//! ephemeral-sequential children `_c_{uuid}-lock-{seq}` (locks, Curator `InterProcessMutex`
//! in protected mode) or `_c_{uuid}-latch-{seq}` (elections, Curator `LeaderLatch`), ordered
//! by the sequence suffix. Children without the `_c_{uuid}-` prefix (`lock-{seq}`, from a
//! Curator client without protection) are ordered with the others.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{ready, Context, Poll};

use fencelock::backend::{Entry, QueueId, QueueKind};
use fencelock::{Error, FencingToken, Result};
use tracing::{debug, warn};
use uuid::Uuid;
use zookeeper_client as zk;

use crate::error::{self, state_error};
use crate::session::ZooKeeperSession;

/// Curator's protected-mode prefix: `_c_` + a UUID + `-`.
pub(crate) const PROTECTED_PREFIX: &str = "_c_";

/// How often a create is retried when the parent vanishes under it (a container reaped by
/// the server between our mkdir and our create).
const CREATE_ATTEMPTS: usize = 10;

/// How many keys of our removed entries a session remembers (see `wait_node_gone`).
const REMEMBER_REMOVED: usize = 32;

/// How many contended queues a session remembers (past that, it arms watches everywhere: a
/// matter of cost only).
const REMEMBER_CONTENDED: usize = 1024;

/// The node-name marker of a queue kind: Curator's lock name.
pub(crate) fn marker(kind: QueueKind) -> &'static str {
    match kind {
        QueueKind::Election => "latch-",
        _ => "lock-",
    }
}

/// The sequence number of an entry called `name` with `marker`, if `name` is one:
/// `[_c_{uuid}-]{marker}{digits}` (ten digits, nineteen past 2^31).
pub(crate) fn sequence_of(name: &str, marker: &str) -> Option<u64> {
    let i = name.rfind(marker)?;
    let prefix = &name[..i];
    if !(prefix.is_empty() || prefix.ends_with('-')) {
        return None;
    }
    let digits = &name[i + marker.len()..];
    if digits.len() < 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `name` is the name of a queue entry of either kind.
pub(crate) fn is_entry_name(name: &str) -> bool {
    sequence_of(name, "lock-").is_some() || sequence_of(name, "latch-").is_some()
}

/// The entries among `children`, in queue order: (sequence, name).
pub(crate) fn sorted_entries(children: Vec<String>, marker: &str) -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = children
        .into_iter()
        .filter_map(|c| sequence_of(&c, marker).map(|s| (s, c)))
        .collect();
    v.sort();
    v
}

/// `parent/child`.
pub(crate) fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// The last segment of `path`.
fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The name prefix of the entry of `attempt`; the server appends the sequence.
pub(crate) fn protected_name(attempt: Uuid, kind: QueueKind) -> String {
    format!("{PROTECTED_PREFIX}{attempt}-{}", marker(kind))
}

fn invalid(name: &str, reason: &'static str) -> Error {
    Error::invalid_name(name, reason)
}

/// Checks what ZooKeeper would refuse in `path` (absolute) beyond the core's name rules:
/// characters ZooKeeper rejects, the reserved top-level `zookeeper` node when there is no
/// chroot, and segments that look like queue entries (they would be mistaken for entries).
/// `shown` is the name reported in the error.
pub(crate) fn check_zk_path(path: &str, shown: &str, chrooted: bool) -> Result<()> {
    for c in path.chars() {
        let bad = c.is_control()
            || ('\u{e000}'..='\u{f8ff}').contains(&c)
            || ('\u{fff0}'..='\u{ffff}').contains(&c);
        if bad {
            return Err(invalid(
                shown,
                "contains a character ZooKeeper rejects in paths (control, U+D800-U+F8FF or U+FFF0-U+FFFF)",
            ));
        }
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
                "a segment looks like a queue entry (lock-/latch- and a sequence number)",
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

/// The parent node of `queue`: `/{namespace}/{name}`, or `/{name}` for the empty namespace.
pub(crate) fn queue_path(queue: &QueueId, chrooted: bool) -> Result<String> {
    fencelock::validate_name(&queue.name)?;
    fencelock::validate_namespace(&queue.namespace)?;
    let path = queue.path();
    let path = if queue.namespace.is_empty() || queue.namespace.starts_with('/') {
        path
    } else {
        format!("/{path}")
    };
    check_zk_path(&path, &queue.path(), chrooted)?;
    Ok(path)
}

fn entry(parent: &str, seq: u64, name: &str, czxid: i64) -> Entry {
    Entry {
        key: join(parent, name),
        token: FencingToken::new(czxid as u64),
        order: seq,
    }
}

impl ZooKeeperSession {
    fn chrooted(&self) -> bool {
        self.backend.config.chroot.is_some()
    }

    fn parent_of(&self, queue: &QueueId) -> Result<String> {
        queue_path(queue, self.chrooted())
    }

    /// Children of `parent` (none if it does not exist).
    async fn children(&self, op: &'static str, parent: &str) -> Result<Vec<String>> {
        let client = self.client()?;
        let res = client.list_children(parent).await;
        match res {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(error::map(op, e)),
        }
    }

    /// Creates `parent` and its ancestors as CONTAINER nodes (persistent on old servers).
    async fn ensure_parent(&self, parent: &str) -> Result<()> {
        let client = self.client()?;
        let acls = self.backend.config.acls();
        loop {
            let containers = self.backend.containers.load(Ordering::Relaxed);
            let mode = if containers {
                zk::CreateMode::Container
            } else {
                zk::CreateMode::Persistent
            };
            match client.mkdir(parent, &mode.with_acls(acls)).await {
                Ok(()) => return Ok(()),
                Err(zk::Error::Unimplemented) if containers => {
                    warn!("the ZooKeeper servers do not support container nodes: parents are created persistent");
                    self.backend.containers.store(false, Ordering::Relaxed);
                }
                Err(zk::Error::NoNode) => {
                    return Err(Error::backend(
                        error::NAME,
                        "create parent",
                        false,
                        "the chroot node does not exist",
                    ))
                }
                Err(e) => return Err(error::map("create parent", e)),
            }
        }
    }

    /// Creates the entry of `attempt` in `parent`, creating the parents if needed. The
    /// attempt is recorded as uncertain before the request goes out, so that a retry after a
    /// lost reply looks for the node first.
    async fn create_entry(
        &self,
        parent: &str,
        attempt: Uuid,
        kind: QueueKind,
        value: &[u8],
    ) -> Result<Entry> {
        let (e, _) = self
            .create_entry_listed(parent, attempt, kind, value, false)
            .await?;
        Ok(e)
    }

    /// [`create_entry`](Self::create_entry), and with `list` the children of `parent` too, in
    /// the same round trip: the listing is sent right behind the create, without waiting for
    /// its reply. ZooKeeper processes the requests of one session in order (a read waits for
    /// the session's earlier writes, on followers too), so the listing shows our new node.
    /// The listing also arms a children watch on `parent` unless our latest enqueue there
    /// found others ahead. It is `None` if it was not asked for or could not be read (the
    /// caller lists again: the entry is known then).
    async fn create_entry_listed(
        &self,
        parent: &str,
        attempt: Uuid,
        kind: QueueKind,
        value: &[u8],
        list: bool,
    ) -> Result<(Entry, Option<(Vec<String>, Option<zk::OneshotWatcher>)>)> {
        const OP: &str = "create entry";
        let prefix = join(parent, &protected_name(attempt, kind));
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.backend.config.acls());
        for _ in 0..CREATE_ATTEMPTS {
            let client = self.client()?;
            self.attempts.lock().unwrap().insert(attempt, None);
            // Both requests go out now, in this order (the client sends on call).
            let create = client.create(&prefix, value, &options);
            // Arm the children watch only where we expect to head the queue (see `own`).
            let watch = !self.contended.lock().unwrap().contains(parent);
            let watched = (list && watch).then(|| client.list_and_watch_children(parent));
            let plain = (list && !watch).then(|| client.list_children(parent));
            let res = create.await;
            match res {
                Ok((stat, seq)) => {
                    let name = format!("{}{seq}", basename(&prefix));
                    let e = entry(parent, seq.into_i64() as u64, &name, stat.czxid);
                    debug!(key = %e.key, czxid = stat.czxid, "created entry");
                    self.attempts
                        .lock()
                        .unwrap()
                        .insert(attempt, Some(e.clone()));
                    let children = match (watched, plain) {
                        (Some(l), _) => l.await.ok().map(|(c, w)| (c, Some(w))),
                        (None, Some(l)) => l.await.ok().map(|c| (c, None)),
                        (None, None) => None,
                    };
                    return Ok((e, children));
                }
                Err(zk::Error::NoNode) => {
                    self.attempts.lock().unwrap().remove(&attempt);
                    self.ensure_parent(parent).await?;
                }
                Err(e) => {
                    // Only a lost connection leaves the outcome open.
                    if !matches!(e, zk::Error::ConnectionLoss | zk::Error::Custom(_)) {
                        self.attempts.lock().unwrap().remove(&attempt);
                    }
                    return Err(error::map(OP, e));
                }
            }
        }
        Err(Error::backend(
            error::NAME,
            OP,
            true,
            "the parent node kept vanishing",
        ))
    }

    /// Finds the entries `attempt` of this session created in `parent`: children named with
    /// the attempt's uuid whose ephemeral owner is this session. A node of another session
    /// with the same uuid is never returned.
    async fn find_own_in(
        &self,
        parent: &str,
        attempt: Uuid,
        kind: QueueKind,
    ) -> Result<Vec<Entry>> {
        const OP: &str = "find entry";
        let prefix = protected_name(attempt, kind);
        let mut found = Vec::new();
        for name in self.children(OP, parent).await? {
            if !name.starts_with(&prefix) {
                continue;
            }
            let Some(seq) = sequence_of(&name, marker(kind)) else {
                continue;
            };
            let path = join(parent, &name);
            let client = self.client()?;
            let res = client.check_stat(&path).await;
            match res {
                Ok(Some(stat)) if stat.ephemeral_owner == self.id => {
                    found.push(entry(parent, seq, &name, stat.czxid));
                }
                Ok(Some(stat)) => {
                    warn!(%path, owner = %format!("{:x}", stat.ephemeral_owner as u64), "a node with our attempt id belongs to another session: ignored");
                }
                Ok(None) => {}
                Err(e) => return Err(error::map(OP, e)),
            }
        }
        Ok(found)
    }

    pub(crate) async fn enqueue_entry(
        &self,
        queue: &QueueId,
        attempt: Uuid,
        value: &[u8],
    ) -> Result<(Entry, bool)> {
        let parent = self.parent_of(queue)?;
        let m = marker(queue.kind);
        let known = self.attempts.lock().unwrap().get(&attempt).cloned();
        let (own, listed) = match known {
            Some(Some(e)) => (e, None),
            Some(None) => {
                let mut own = self.find_own_in(&parent, attempt, queue.kind).await?;
                if own.is_empty() {
                    self.create_entry_listed(&parent, attempt, queue.kind, value, true)
                        .await?
                } else {
                    own.sort_by_key(|e| e.order);
                    let e = own.remove(0);
                    debug!(key = %e.key, "adopted the entry of a create whose reply was lost");
                    self.attempts
                        .lock()
                        .unwrap()
                        .insert(attempt, Some(e.clone()));
                    (e, None)
                }
            }
            None => {
                self.create_entry_listed(&parent, attempt, queue.kind, value, true)
                    .await?
            }
        };
        let name = basename(&own.key);
        // The listing sent with the create shows our node; should it not, list again.
        let (sorted, armed) = match listed {
            Some((children, watch)) => {
                let sorted = sorted_entries(children, m);
                if sorted.iter().any(|(_, n)| n == name) {
                    (Some(sorted), watch)
                } else {
                    if let Some(w) = watch {
                        detach(w);
                    }
                    (None, None)
                }
            }
            None => (None, None),
        };
        let sorted = match sorted {
            Some(sorted) => sorted,
            None => sorted_entries(self.children("list queue", &parent).await?, m),
        };
        let replaced = match self.own.lock().unwrap().entry(own.key.clone()) {
            std::collections::hash_map::Entry::Occupied(mut o) => match armed {
                Some(w) => o.insert(Some(w)),
                None => None,
            },
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(armed);
                None
            }
        };
        if let Some(w) = replaced {
            detach(w);
        }
        let pos = sorted.iter().position(|(_, n)| n == name);
        {
            let mut contended = self.contended.lock().unwrap();
            if pos == Some(0) {
                contended.remove(&parent);
            } else if contended.len() < REMEMBER_CONTENDED {
                contended.insert(parent.clone());
            }
        }
        if let Some(i) = pos.filter(|&i| i > 0) {
            // The predecessor's czxid is unknown here (0): the path identifies it.
            let (seq, pred) = &sorted[i - 1];
            self.predecessors
                .lock()
                .unwrap()
                .insert(own.key.clone(), entry(&parent, *seq, pred, 0));
        }
        self.attempts.lock().unwrap().remove(&attempt);
        Ok((own, pos == Some(0)))
    }

    pub(crate) async fn predecessor_of(
        &self,
        queue: &QueueId,
        own: &Entry,
    ) -> Result<Option<Entry>> {
        let parent = self.parent_of(queue)?;
        // Right after an enqueue that found a predecessor, its listing answers (once).
        if let Some(pred) = self.predecessors.lock().unwrap().remove(&own.key) {
            return Ok(Some(pred));
        }
        let children = self.children("list queue", &parent).await?;
        let sorted = sorted_entries(children, marker(queue.kind));
        let name = basename(&own.key);
        let Some(pos) = sorted.iter().position(|(_, n)| n == name) else {
            return Err(Error::EntryVanished {
                key: own.key.clone(),
            });
        };
        Ok(pos.checked_sub(1).map(|i| {
            let (seq, name) = &sorted[i];
            // The predecessor's czxid is unknown here (0): the path identifies it.
            entry(&parent, *seq, name, 0)
        }))
    }

    /// Waits until the node `e.key` is gone, with a data watch (as Curator does: unlike an
    /// exists watch, it leaves no watch behind when the node is already gone).
    ///
    /// On one of our own entries, the children watch its enqueue armed is used first (it
    /// costs no request: until it fires, the entry is there); and the watch is left to fire
    /// rather than removed when the wait is given up (see [`OwnWatch`]).
    pub(crate) async fn wait_node_gone(&self, e: &Entry) -> Result<()> {
        const OP: &str = "watch entry";
        let (own, armed) = match self.own.lock().unwrap().get_mut(&e.key) {
            Some(armed) => (true, armed.take()),
            None => (false, None), // not ours, or removed (then `removed` has it)
        };
        if let Some(armed) = armed {
            let broken = self.broken(OP);
            let mut fired = OwnWatch::new(armed, true);
            tokio::select! {
                ev = &mut fired => {
                    if ev.event_type == zk::EventType::NodeDeleted {
                        return Ok(()); // the parent went, and our entry with it
                    }
                    check_session_event(OP, &ev)?;
                    // A child came or went: see whether it was ours.
                }
                err = broken => {
                    fired.discard(); // the retry watches afresh
                    return Err(err);
                }
            }
        }
        loop {
            if self.removed.lock().unwrap().contains(&e.key) {
                // We deleted it: our delete went out before any request this wait could
                // send, which would only find the node gone. (A wait on an entry being
                // released, which the release cancels anyway.)
                return Ok(());
            }
            let broken = self.broken(OP);
            let client = self.client()?;
            let res = client.get_and_watch_data(&e.key).await;
            drop(client);
            let watcher = match res {
                Err(zk::Error::NoNode) => return Ok(()),
                Err(err) => return Err(error::map(OP, err)),
                Ok((_, stat, _)) if e.token.get() != 0 && stat.czxid as u64 != e.token.get() => {
                    return Ok(()); // a different node under the same path
                }
                Ok((_, _, watcher)) => watcher,
            };
            let mut fired = OwnWatch::new(watcher, own);
            tokio::select! {
                ev = &mut fired => match ev.event_type {
                    zk::EventType::NodeDeleted => return Ok(()),
                    zk::EventType::Session => {
                        return Err(state_error(OP, ev.session_state)
                            .unwrap_or_else(|| error::disconnected(OP)));
                    }
                    _ => continue, // data changed: watch again
                },
                err = broken => {
                    fired.discard(); // the retry watches afresh
                    return Err(err);
                }
            }
        }
    }

    pub(crate) async fn remove_entry(&self, e: &Entry) -> Result<bool> {
        self.forget_key(&e.key);
        let client = self.client()?;
        let res = client.delete(&e.key, None).await;
        match res {
            Ok(()) => {
                debug!(key = %e.key, "deleted entry");
                Ok(true)
            }
            Err(zk::Error::NoNode) => Ok(false),
            Err(err) => Err(error::map("delete entry", err)),
        }
    }

    fn forget_key(&self, key: &str) {
        self.attempts
            .lock()
            .unwrap()
            .retain(|_, e| e.as_ref().is_none_or(|e| e.key != key));
        self.predecessors.lock().unwrap().remove(key);
        let armed = {
            // One step for a concurrent wait: our entry, or one we removed.
            let mut own = self.own.lock().unwrap();
            let Some(armed) = own.remove(key) else {
                return;
            };
            let mut removed = self.removed.lock().unwrap();
            if removed.len() >= REMEMBER_REMOVED {
                removed.pop_front();
            }
            removed.push_back(key.to_string());
            armed
        };
        if let Some(w) = armed {
            detach(w); // the node is deleted next: the watch fires at once
        }
    }

    pub(crate) async fn abandon_attempt(&self, queue: &QueueId, attempt: Uuid) -> Result<()> {
        let parent = self.parent_of(queue)?;
        for e in self.find_own_in(&parent, attempt, queue.kind).await? {
            self.remove_entry(&e).await?;
        }
        self.attempts.lock().unwrap().remove(&attempt);
        Ok(())
    }

    pub(crate) async fn set_entry_value(&self, e: &Entry, value: &[u8]) -> Result<bool> {
        let client = self.client()?;
        let res = client.set_data(&e.key, value, None).await;
        match res {
            Ok(_) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(err) => Err(error::map("set value", err)),
        }
    }

    pub(crate) async fn queue_head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> {
        const OP: &str = "read head";
        let parent = self.parent_of(queue)?;
        loop {
            let children = self.children(OP, &parent).await?;
            let sorted = sorted_entries(children, marker(queue.kind));
            let Some((seq, name)) = sorted.into_iter().next() else {
                return Ok(None);
            };
            let path = join(&parent, &name);
            let client = self.client()?;
            let res = client.get_data(&path).await;
            match res {
                Ok((data, stat)) => {
                    return Ok(Some((entry(&parent, seq, &name, stat.czxid), data)))
                }
                Err(zk::Error::NoNode) => continue, // the head went meanwhile
                Err(err) => return Err(error::map(OP, err)),
            }
        }
    }

    /// Waits until the head of `queue` or its value differs from `seen`, with a children
    /// watch on the parent (an exists watch while the parent is missing) and a data watch on
    /// the head.
    pub(crate) async fn wait_head_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()> {
        const OP: &str = "watch queue";
        let parent = self.parent_of(queue)?;
        let m = marker(queue.kind);
        loop {
            let broken = self.broken(OP);
            let client = self.client()?;
            let res = client.get_and_watch_children(&parent).await;
            let (children, child_watch) = match res {
                Ok((children, _, w)) => (children, w),
                Err(zk::Error::NoNode) => {
                    if seen.is_some() {
                        return Ok(());
                    }
                    // Wait for the parent to appear.
                    let res = client.check_and_watch_stat(&parent).await;
                    drop(client);
                    match res {
                        Ok((Some(_), _)) => continue,
                        Ok((None, w)) => {
                            tokio::select! {
                                ev = w.changed() => {
                                    check_session_event(OP, &ev)?;
                                    continue;
                                }
                                err = broken => return Err(err),
                            }
                        }
                        Err(err) => return Err(error::map(OP, err)),
                    }
                }
                Err(err) => return Err(error::map(OP, err)),
            };
            let head = sorted_entries(children, m).into_iter().next();
            let (seen_entry, seen_value) = match (head, seen) {
                (None, None) => {
                    drop(client);
                    tokio::select! {
                        ev = child_watch.changed() => {
                            check_session_event(OP, &ev)?;
                            continue;
                        }
                        err = broken => return Err(err),
                    }
                }
                (Some((_, name)), Some((e, v))) if join(&parent, &name) == e.key => (e, v),
                _ => return Ok(()),
            };
            let res = client.get_and_watch_data(&seen_entry.key).await;
            drop(client);
            let data_watch = match res {
                Err(zk::Error::NoNode) => return Ok(()),
                Err(err) => return Err(error::map(OP, err)),
                Ok((data, stat, w)) => {
                    if stat.czxid as u64 != seen_entry.token.get() || data != *seen_value {
                        return Ok(());
                    }
                    w
                }
            };
            tokio::select! {
                ev = child_watch.changed() => check_session_event(OP, &ev)?,
                ev = data_watch.changed() => check_session_event(OP, &ev)?,
                err = broken => return Err(err),
            }
        }
    }

    /// Every entry node under `namespace`, sorted (full paths, relative to the chroot).
    pub(crate) async fn list_entries(&self, namespace: &str) -> Result<Vec<String>> {
        const OP: &str = "list";
        let root = namespace_root(namespace, self.chrooted())?;
        let skip_reserved = !self.chrooted();
        let mut out = Vec::new();
        let mut dirs = vec![root];
        while !dirs.is_empty() {
            let client = self.client()?;
            let lists =
                futures::future::join_all(dirs.iter().map(|d| client.list_children(d))).await;
            let mut next = Vec::new();
            for (dir, res) in dirs.iter().zip(lists) {
                let children = match res {
                    Ok(c) => c,
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(error::map(OP, e)),
                };
                for child in children {
                    if skip_reserved && dir == "/" && child == "zookeeper" {
                        continue;
                    }
                    let path = join(dir, &child);
                    if is_entry_name(&child) {
                        out.push(path);
                    } else {
                        next.push(path);
                    }
                }
            }
            dirs = next;
        }
        out.sort();
        Ok(out)
    }
}

/// A one-shot watch awaited. One of our own entries' (or of their parents' children), `keep`
/// set: dropped before it fired (a wait given up: the entry is being released), it is not
/// removed from the server, which would cost a RemoveWatches request sent ahead of the
/// delete that follows, but left to fire in a task of its own, which ends as soon as the
/// entry goes (or the session). Any other is removed when dropped, as usual.
struct OwnWatch {
    fired: Option<Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>>,
    keep: bool,
}

impl OwnWatch {
    fn new(watch: zk::OneshotWatcher, keep: bool) -> Self {
        OwnWatch {
            fired: Some(Box::pin(watch.changed())),
            keep,
        }
    }

    /// Removes the watch when dropped after all (a wait that failed: its retry watches
    /// afresh, so repeated failures leave no watches behind).
    fn discard(&mut self) {
        self.keep = false;
    }
}

impl Future for OwnWatch {
    type Output = zk::WatchedEvent;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<zk::WatchedEvent> {
        let fired = self.fired.as_mut().expect("OwnWatch polled after it fired");
        let ev = ready!(fired.as_mut().poll(cx));
        self.fired = None;
        Poll::Ready(ev)
    }
}

impl Drop for OwnWatch {
    fn drop(&mut self) {
        let Some(fired) = self.fired.take() else {
            return;
        };
        if let (true, Ok(rt)) = (self.keep, tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                fired.await;
            });
        }
    }
}

/// Leaves a watch of one of our own entries to fire (see [`OwnWatch`]).
fn detach(watch: zk::OneshotWatcher) {
    drop(OwnWatch::new(watch, true));
}

/// A watch fired by a session event (terminal state) ends the wait with the session's error.
fn check_session_event(op: &'static str, ev: &zk::WatchedEvent) -> Result<()> {
    if ev.event_type == zk::EventType::Session {
        if let Some(e) = state_error(op, ev.session_state) {
            return Err(e);
        }
    }
    Ok(())
}

/// Test support: the create-reply-lost case and ownership checks, driven from the outside.
#[doc(hidden)]
impl ZooKeeperSession {
    /// Creates the entry of `attempt` in `queue` and drops the reply, as a lost connection
    /// would: the session only knows that the create was sent. Returns the created path (for
    /// the test's assertions only).
    #[doc(hidden)]
    pub async fn create_reply_lost(
        &self,
        queue: &QueueId,
        attempt: Uuid,
        value: &[u8],
    ) -> Result<String> {
        let parent = self.parent_of(queue)?;
        let e = self
            .create_entry(&parent, attempt, queue.kind, value)
            .await?;
        self.attempts.lock().unwrap().insert(attempt, None);
        Ok(e.key)
    }

    /// Marks `attempt` as sent with its reply lost, without creating anything: the next
    /// `enqueue` of it looks for an existing node first.
    #[doc(hidden)]
    pub fn assume_create_sent(&self, attempt: Uuid) {
        self.attempts.lock().unwrap().insert(attempt, None);
    }

    /// The entries of this session for `attempt` in `queue` (what the recovery adopts).
    #[doc(hidden)]
    pub async fn find_own(&self, queue: &QueueId, attempt: Uuid) -> Result<Vec<Entry>> {
        let parent = self.parent_of(queue)?;
        self.find_own_in(&parent, attempt, queue.kind).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(ns: &str, name: &str) -> QueueId {
        QueueId {
            namespace: ns.into(),
            name: name.into(),
            kind: QueueKind::Lock,
        }
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
        let sorted = sorted_entries(
            vec![
                "_c_b-lock-0000000003".into(),
                "lock-0000000001".into(),
                "other".into(),
                "_c_a-latch-0000000000".into(),
                "_c_a-lock-0000000002".into(),
            ],
            "lock-",
        );
        let names: Vec<_> = sorted.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "lock-0000000001",
                "_c_a-lock-0000000002",
                "_c_b-lock-0000000003"
            ]
        );
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
        assert!(queue_path(&q("ns", "x/lock-0000000001"), false).is_err());
        assert_eq!(namespace_root("", false).unwrap(), "/");
        assert_eq!(namespace_root("/a/b", false).unwrap(), "/a/b");
        assert!(namespace_root("zookeeper", false).is_err());
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }
}
