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

use crate::backend::{Backend, BackendSession, Entry, QueueId};
use crate::{Error, FencingToken, LostReason, Result};

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
}

impl MemoryBackend {
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
            _ => Err(Error::SessionLost(LostReason::Expired)),
        }
    }

    /// The entries directly in `queue`, in queue order.
    fn queue(&self, queue: &QueueId) -> Vec<(String, Record)> {
        let prefix = format!("{}/", queue.path());
        let mut v: Vec<_> = self
            .entries
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(k, _)| !k[prefix.len()..].contains('/'))
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        v.sort_by_key(|(_, r)| r.create_rev);
        v
    }

    fn same(&self, entry: &Entry) -> Option<&Record> {
        self.entries
            .get(&entry.key)
            .filter(|r| r.create_rev == entry.order)
    }
}

fn entry(key: String, r: &Record) -> Entry {
    Entry {
        key,
        token: FencingToken::new(r.create_rev),
        order: r.create_rev,
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

    async fn enqueue(
        &self,
        queue: &QueueId,
        _attempt: Uuid,
        value: &[u8],
    ) -> Result<(Entry, bool)> {
        let mut st = self.inner.lock();
        st.alive(self.id)?;
        let key = format!("{}/{:x}", queue.path(), self.id);
        if !st.entries.contains_key(&key) {
            st.revision += 1;
            let record = Record {
                create_rev: st.revision,
                session: self.id,
                value: value.to_vec(),
            };
            st.entries.insert(key.clone(), record);
            self.inner.notify(&st);
        }
        let record = st.entries[&key].clone();
        let head = st.queue(queue).first().is_some_and(|(k, _)| *k == key);
        Ok((entry(key, &record), head))
    }

    async fn predecessor(&self, queue: &QueueId, e: &Entry) -> Result<Option<Entry>> {
        let st = self.inner.lock();
        if st.same(e).is_none() {
            return Err(Error::EntryVanished { key: e.key.clone() });
        }
        Ok(st
            .queue(queue)
            .into_iter()
            .rev()
            .find(|(_, r)| r.create_rev < e.order)
            .map(|(k, r)| entry(k, &r)))
    }

    async fn wait_gone(&self, e: &Entry) -> Result<()> {
        self.wait_until(|st| st.same(e).is_none()).await;
        Ok(())
    }

    async fn remove(&self, e: &Entry) -> Result<bool> {
        let mut st = self.inner.lock();
        if st.same(e).is_none() {
            return Ok(false);
        }
        st.entries.remove(&e.key);
        st.revision += 1;
        self.inner.notify(&st);
        Ok(true)
    }

    async fn abandon(&self, queue: &QueueId, _attempt: Uuid) -> Result<()> {
        let mut st = self.inner.lock();
        let key = format!("{}/{:x}", queue.path(), self.id);
        if st.entries.remove(&key).is_some() {
            st.revision += 1;
            self.inner.notify(&st);
        }
        Ok(())
    }

    async fn set_value(&self, e: &Entry, value: &[u8]) -> Result<bool> {
        let mut st = self.inner.lock();
        st.alive(self.id)?;
        let Some(key) = st.same(e).map(|_| e.key.clone()) else {
            return Ok(false);
        };
        st.entries.get_mut(&key).expect("present").value = value.to_vec();
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

    async fn close(&self) -> Result<()> {
        let mut st = self.inner.lock();
        if st.sessions.get(&self.id).is_some_and(|s| s.alive) {
            st.kill(self.id);
            self.inner.notify(&st);
        }
        Ok(())
    }
}
