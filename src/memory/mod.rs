//! The in-memory backend: the same semantics as etcd and ZooKeeper inside one process.
//!
//! **A test double, never a production backend**: it provides no mutual exclusion between
//! processes. Use it for unit tests of code that takes locks or runs elections, and for the
//! quickstart. Sessions expire after their TTL without heartbeats, exactly like an etcd lease;
//! time is tokio's clock, so tests under `#[tokio::test(start_paused = true)]` run on a virtual
//! clock. Keys follow the etcd layout `{namespace}/{name}/{session id in hex}`, tokens are a
//! backend-wide revision counter.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use crate::backend::{
    Backend, BackendSession, EnqueueRequest, Enqueued, Entry, EntryInfo, EntryKind, Peer, QueueId,
    QueueKind, REVOKE_MARKER,
};
use crate::{Error, FencingToken, Result, SessionEnd};

const NAME: &str = "memory";

/// The in-memory backend. Clones share the same "cluster".
///
/// ```
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use fencelock::{MemoryBackend, Session};
/// let backend = MemoryBackend::new();
/// let session = Session::builder(backend.clone()).start().await?;
/// let _guard = session.mutex("a")?.lock().await?;
/// assert_eq!(session.list_entries().await?.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    state: StdMutex<State>,
    changed: watch::Sender<u64>,
    /// Fault injection: how many creates are still to be carried out and then answered with a
    /// temporary error, as when a reply is lost on its way back.
    lost_replies: std::sync::atomic::AtomicUsize,
    /// The same for removals (a release, say).
    lost_remove_replies: std::sync::atomic::AtomicUsize,
    /// Signalled at each reply lost that way.
    reply_lost: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    revision: u64,
    next_session: u64,
    sessions: HashMap<u64, Sess>,
    entries: BTreeMap<String, Record>,
}

#[derive(Debug)]
struct Sess {
    ttl: Duration,
    expires: Instant,
    alive: bool,
}

#[derive(Debug, Clone)]
struct Record {
    create_rev: u64,
    session: u64,
    kind: EntryKind,
    value: Vec<u8>,
}

impl MemoryBackend {
    /// A new, empty in-memory cluster.
    pub fn new() -> Self {
        Self::default()
    }

    /// Expires session `id` (as given by [`crate::Session::id`]) at once, as the cluster would
    /// after a missed TTL: for tests of expiry handling. Returns whether it was alive.
    pub fn expire_session(&self, id: &str) -> bool {
        let Ok(id) = u64::from_str_radix(id, 16) else {
            return false;
        };
        let mut st = self.inner.state.lock().unwrap();
        let alive = st.sessions.get(&id).is_some_and(|s| s.alive);
        if alive {
            st.kill(id);
            self.inner.notify(&st);
        }
        alive
    }

    /// Fault injection: the next `n` create requests (an enqueue, or a multi-lock's
    /// all-or-nothing create) are carried out, then answered with a temporary error, as when
    /// the cluster committed a request whose reply was lost. For tests of the
    /// create-succeeded-but-reply-lost case.
    #[cfg(feature = "testing")]
    pub fn lose_create_replies(&self, n: usize) {
        self.inner
            .lost_replies
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Fault injection: the next `n` removals of an entry (a release) are carried out, then
    /// answered with a temporary error, as when the reply of a committed delete was lost.
    #[cfg(feature = "testing")]
    pub fn lose_remove_replies(&self, n: usize) {
        self.inner
            .lost_remove_replies
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Resolves at the next reply lost by [`lose_create_replies`](Self::lose_create_replies)
    /// or [`lose_remove_replies`](Self::lose_remove_replies).
    #[cfg(feature = "testing")]
    pub async fn reply_lost(&self) {
        self.inner.reply_lost.notified().await
    }

    /// **Testing only** (feature `testing`): writes `key` as another tool would, bypassing
    /// fencelock's names (say `{namespace}/jobs//{session}`, the key `etcdctl lock` makes
    /// for a prefix ending in `/`), owned by session `session` (an id as
    /// [`Session::id`](crate::Session::id) gives) so that it goes with it. Returns whether
    /// that session is alive and the key was written.
    #[cfg(feature = "testing")]
    pub fn put_foreign_key(&self, key: &str, session: &str) -> bool {
        let Ok(session) = u64::from_str_radix(session, 16) else {
            return false;
        };
        let mut st = self.inner.lock();
        if st.alive(session).is_err() {
            return false;
        }
        st.revision += 1;
        let record = Record {
            create_rev: st.revision,
            session,
            kind: EntryKind::Exclusive,
            value: Vec::new(),
        };
        st.entries.insert(key.to_string(), record);
        self.inner.notify(&st);
        true
    }

    /// Deletes the entry at `key` as an outsider would (an operator with a CLI): its holder's
    /// `lost()` fires with [`LostReason::EntryDeleted`](crate::LostReason::EntryDeleted).
    /// Returns whether it existed.
    pub fn delete_key(&self, key: &str) -> bool {
        let mut st = self.inner.lock();
        let existed = st.entries.remove(key).is_some();
        if existed {
            st.revision += 1;
            self.inner.notify(&st);
        }
        existed
    }
}

impl Inner {
    fn notify(&self, st: &State) {
        self.changed.send_replace(st.revision);
    }

    /// Whether the reply of this `op` (counted down in `counter`) is to be lost (see
    /// [`MemoryBackend::lose_create_replies`]).
    fn lose_reply(&self, counter: &std::sync::atomic::AtomicUsize, op: &'static str) -> Result<()> {
        use std::sync::atomic::Ordering;
        let lose = counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            self.reply_lost.notify_one();
            return Err(Error::backend(
                NAME,
                op,
                true,
                "reply lost (fault injection)",
            ));
        }
        Ok(())
    }

    /// Locks the state after expiring every session past its TTL.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        let mut st = self.state.lock().unwrap();
        let now = Instant::now();
        let due: Vec<u64> = st
            .sessions
            .iter()
            .filter(|(_, s)| s.alive && s.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        if !due.is_empty() {
            for id in due {
                st.kill(id);
            }
            self.notify(&st);
        }
        st
    }
}

impl State {
    fn kill(&mut self, id: u64) {
        if let Some(s) = self.sessions.get_mut(&id) {
            s.alive = false;
        }
        let before = self.entries.len();
        self.entries.retain(|_, r| r.session != id);
        if self.entries.len() != before {
            self.revision += 1;
        }
    }

    fn alive(&self, id: u64) -> Result<()> {
        match self.sessions.get(&id) {
            Some(s) if s.alive => Ok(()),
            _ => Err(Error::SessionLost(SessionEnd::Expired)),
        }
    }

    /// The entries directly in `queue`, in queue order.
    fn queue(&self, queue: &QueueId) -> Vec<(String, Record)> {
        let prefix = format!("{}/", queue.path());
        let mut v: Vec<_> = self
            .entries
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(k, _)| in_queue(queue.kind, &k[prefix.len()..]))
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        v.sort_by_key(|(_, r)| r.create_rev);
        v
    }

    fn same(&self, key: &str, order: u64) -> Option<&Record> {
        self.entries.get(key).filter(|r| r.create_rev == order)
    }

    /// Creates `key` in `queue` for `session` unless it exists; returns it with the entries
    /// ahead of it.
    fn enqueue(&mut self, session: u64, req: &EnqueueRequest<'_>, key: &str) -> (Entry, Vec<Peer>) {
        if !self.entries.contains_key(key) {
            self.revision += 1;
            let record = Record {
                create_rev: self.revision,
                session,
                kind: req.kind,
                value: req.value.to_vec(),
            };
            self.entries.insert(key.to_string(), record);
        }
        let own = self.entries[key].clone();
        let ahead = self
            .queue(req.queue)
            .into_iter()
            .filter(|(_, r)| r.create_rev < own.create_rev)
            .map(|(k, r)| peer(k, &r))
            .collect();
        (entry(key.to_string(), &own), ahead)
    }
}

/// Whether `rest` (a key below a queue's prefix) names an entry of a `kind` queue: `{session}`
/// directly, or `read/{..}` / `write/{..}` in a read-write lock.
fn in_queue(kind: QueueKind, rest: &str) -> bool {
    match kind {
        QueueKind::ReadWrite => match rest.split_once('/') {
            Some(("read" | "write", id)) => !id.is_empty() && !id.contains('/'),
            _ => false,
        },
        _ => !rest.is_empty() && !rest.contains('/'),
    }
}

fn entry(key: String, r: &Record) -> Entry {
    Entry {
        key,
        token: FencingToken::new(r.create_rev),
        order: r.create_rev,
        kind: r.kind,
    }
}

fn peer(key: String, r: &Record) -> Peer {
    Peer {
        key,
        order: r.create_rev,
        kind: r.kind,
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn min_ttl(&self) -> Duration {
        Duration::from_millis(10)
    }

    async fn open_session(&self, ttl: Duration) -> Result<Arc<dyn BackendSession>> {
        let id = {
            let mut st = self.inner.lock();
            st.next_session += 1;
            let id = st.next_session;
            st.sessions.insert(
                id,
                Sess {
                    ttl,
                    expires: Instant::now() + ttl,
                    alive: true,
                },
            );
            id
        };
        // The reaper: expires the session when its TTL runs out without a heartbeat.
        let inner = self.inner.clone();
        tokio::spawn(async move {
            loop {
                let expires = match inner.state.lock().unwrap().sessions.get(&id) {
                    Some(s) if s.alive => s.expires,
                    _ => return,
                };
                tokio::time::sleep_until(expires).await;
                drop(inner.lock()); // expires whatever is due
            }
        });
        Ok(Arc::new(MemorySession {
            inner: self.inner.clone(),
            id,
            ttl,
        }))
    }
}

#[derive(Debug)]
struct MemorySession {
    inner: Arc<Inner>,
    id: u64,
    ttl: Duration,
}

impl MemorySession {
    /// This session's key for an entry of `kind` made by `attempt` in `queue`: the etcd layout,
    /// `{namespace}/{name}/{session id in hex}` (one per session), or with the attempt for
    /// entries a session may hold several of (readers, writers, permits).
    fn key(&self, queue: &QueueId, kind: EntryKind, attempt: Uuid) -> String {
        let path = queue.path();
        let id = self.id;
        let attempt = attempt.simple();
        match (queue.kind, kind) {
            (QueueKind::ReadWrite, EntryKind::Shared) => format!("{path}/read/{id:x}_{attempt}"),
            (QueueKind::ReadWrite, _) => format!("{path}/write/{id:x}_{attempt}"),
            (QueueKind::Semaphore, _) => format!("{path}/{id:x}_{attempt}"),
            _ => format!("{path}/{id:x}"),
        }
    }

    /// Waits until `done` holds for the state, re-checking after every change.
    async fn wait_until(&self, mut done: impl FnMut(&State) -> bool) {
        let mut rx = self.inner.changed.subscribe();
        loop {
            {
                let st = self.inner.lock();
                rx.borrow_and_update();
                if done(&st) {
                    return;
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

#[async_trait]
impl BackendSession for MemorySession {
    fn id(&self) -> String {
        format!("{:x}", self.id)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn keep_alive(&self) -> Result<()> {
        let mut st = self.inner.lock();
        st.alive(self.id)?;
        let s = st.sessions.get_mut(&self.id).expect("alive session");
        s.expires = Instant::now() + s.ttl;
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        let mut st = self.inner.lock();
        if st.sessions.get(&self.id).is_some_and(|s| s.alive) {
            st.kill(self.id);
            self.inner.notify(&st);
        }
        Ok(())
    }

    async fn enqueue(&self, req: EnqueueRequest<'_>) -> Result<Enqueued> {
        let mut st = self.inner.lock();
        st.alive(self.id)?;
        let key = self.key(req.queue, req.kind, req.attempt);
        let (entry, ahead) = st.enqueue(self.id, &req, &key);
        self.inner.notify(&st);
        self.inner.lose_reply(&self.inner.lost_replies, "create")?;
        Ok(Enqueued::new(entry, ahead))
    }

    async fn enqueue_all(&self, reqs: &[EnqueueRequest<'_>]) -> Result<Option<Vec<Entry>>> {
        let mut st = self.inner.lock();
        st.alive(self.id)?;
        let keys: Vec<String> = reqs
            .iter()
            .map(|r| self.key(r.queue, r.kind, r.attempt))
            .collect();
        // A retry finds what the first try created: our own entries do not count as taken.
        let taken = reqs
            .iter()
            .zip(&keys)
            .any(|(r, key)| st.queue(r.queue).iter().any(|(k, _)| k != key));
        if taken {
            return Ok(None);
        }
        let entries = reqs
            .iter()
            .zip(&keys)
            .map(|(r, key)| st.enqueue(self.id, r, key).0)
            .collect();
        self.inner.notify(&st);
        self.inner.lose_reply(&self.inner.lost_replies, "create")?;
        Ok(Some(entries))
    }

    async fn wait(&self, own: &Entry, target: &Peer) -> Result<()> {
        {
            let st = self.inner.lock();
            if st.same(&own.key, own.order).is_none() {
                return Err(Error::EntryVanished {
                    key: own.key.clone(),
                });
            }
        }
        self.wait_until(|st| st.same(&target.key, target.order).is_none())
            .await;
        Ok(())
    }

    async fn exists(&self, own: &Entry) -> Result<bool> {
        Ok(self.inner.lock().same(&own.key, own.order).is_some())
    }

    async fn still_ahead(
        &self,
        own: &Entry,
        queue: &QueueId,
        kind: Option<EntryKind>,
        nearest: usize,
    ) -> Result<Vec<Peer>> {
        let st = self.inner.lock();
        if st.same(&own.key, own.order).is_none() {
            return Err(Error::EntryVanished {
                key: own.key.clone(),
            });
        }
        let ahead: Vec<Peer> = st
            .queue(queue)
            .into_iter()
            .filter(|(_, r)| r.create_rev < own.order && kind.is_none_or(|k| r.kind == k))
            .map(|(key, r)| Peer {
                key,
                order: r.create_rev,
                kind: r.kind,
            })
            .collect();
        Ok(ahead[ahead.len().saturating_sub(nearest)..].to_vec())
    }

    async fn wait_own_gone(&self, own: &Entry) -> Result<()> {
        self.wait_until(|st| st.same(&own.key, own.order).is_none())
            .await;
        Ok(())
    }

    async fn remove(&self, e: &Entry) -> Result<bool> {
        let mut st = self.inner.lock();
        if st.same(&e.key, e.order).is_none() {
            return Ok(false);
        }
        st.entries.remove(&e.key);
        st.revision += 1;
        self.inner.notify(&st);
        drop(st);
        self.inner
            .lose_reply(&self.inner.lost_remove_replies, "remove")?;
        Ok(true)
    }

    async fn abandon(&self, queue: &QueueId, kind: EntryKind, attempt: Uuid) -> Result<()> {
        let mut st = self.inner.lock();
        if st.entries.remove(&self.key(queue, kind, attempt)).is_some() {
            st.revision += 1;
            self.inner.notify(&st);
        }
        Ok(())
    }

    async fn set_value(&self, e: &Entry, value: &[u8]) -> Result<bool> {
        let mut st = self.inner.lock();
        st.alive(self.id)?;
        if st.same(&e.key, e.order).is_none() {
            return Ok(false);
        }
        st.entries.get_mut(&e.key).expect("present").value = value.to_vec();
        st.revision += 1;
        self.inner.notify(&st);
        Ok(true)
    }

    async fn head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> {
        let st = self.inner.lock();
        Ok(st
            .queue(queue)
            .into_iter()
            .next()
            .map(|(k, r)| (entry(k, &r), r.value)))
    }

    async fn wait_queue_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()> {
        self.wait_until(|st| {
            let head = st.queue(queue).into_iter().next();
            match (head, seen) {
                (None, None) => false,
                (Some((k, r)), Some((e, v))) => {
                    !(k == e.key && r.create_rev == e.order && r.value == *v)
                }
                _ => true,
            }
        })
        .await;
        Ok(())
    }

    async fn inspect(&self, queue: &QueueId) -> Result<Vec<EntryInfo>> {
        let st = self.inner.lock();
        Ok(st
            .queue(queue)
            .into_iter()
            .map(|(k, r)| {
                EntryInfo::new(
                    k,
                    FencingToken::new(r.create_rev),
                    r.kind,
                    format!("{:x}", r.session),
                    r.value,
                    None,
                )
            })
            .collect())
    }

    async fn request_revoke(&self, key: &str, token: FencingToken) -> Result<bool> {
        let mut st = self.inner.lock();
        let Some(r) = st
            .entries
            .get_mut(key)
            .filter(|r| r.create_rev == token.get())
        else {
            return Ok(false);
        };
        r.value = REVOKE_MARKER.to_vec();
        st.revision += 1;
        self.inner.notify(&st);
        Ok(true)
    }

    async fn wait_revoke(&self, own: &Entry) -> Result<()> {
        let mut gone = false;
        self.wait_until(|st| match st.same(&own.key, own.order) {
            None => {
                gone = true;
                true
            }
            Some(r) => r.value == REVOKE_MARKER,
        })
        .await;
        if gone {
            return Err(Error::EntryVanished {
                key: own.key.clone(),
            });
        }
        Ok(())
    }

    async fn list(&self, namespace: &str) -> Result<Vec<String>> {
        let st = self.inner.lock();
        let prefix = format!("{namespace}/");
        Ok(st
            .entries
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect())
    }
}
