//! One in-memory session: the backend operations on the simulated cluster.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use uuid::Uuid;

use super::cluster::{entry, State};
use super::{Inner, NAME};
use crate::backend::{
    key_value_entry_key, BackendSession, EnqueueRequest, Enqueued, Entry, EntryInfo, EntryKind,
    Peer, QueueId, SessionEvent, REVOKE_MARKER,
};
use crate::{Error, FencingToken, Result};

#[derive(Debug)]
pub(super) struct MemorySession {
    pub(super) inner: Arc<Inner>,
    pub(super) id: u64,
    pub(super) ttl: Duration,
}

impl MemorySession {
    /// The entries of `queue` as [`BackendSession::inspect`] answers.
    fn inspect_now(&self, queue: &QueueId) -> Vec<EntryInfo> {
        let st = self.inner.lock();
        st.queue(queue)
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
            .collect()
    }

    /// This session's key for an entry of `kind` made by `attempt` in `queue`: the etcd layout,
    /// `{namespace}/{name}/{session id in hex}` (one per session), or with the attempt for
    /// entries a session may hold several of (readers, writers, permits).
    fn key(&self, queue: &QueueId, kind: EntryKind, attempt: Uuid) -> String {
        key_value_entry_key(queue, &format!("{:x}", self.id), kind, attempt)
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
        // Held by fault injection: waits, unanswered, until released.
        while self
            .inner
            .hold_keep_alives
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            // Registered before the flag is read again: a release in between is not missed.
            let mut released = std::pin::pin!(self.inner.keep_alives_released.notified());
            released.as_mut().enable();
            self.inner.keep_alive_held.notify_one();
            if self
                .inner
                .hold_keep_alives
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                released.await;
            }
        }
        let mut st = self.inner.lock();
        st.alive(self.id)?;
        let s = st.sessions.get_mut(&self.id).expect("alive session");
        s.expires = Instant::now() + s.ttl;
        Ok(())
    }

    /// A break reported by fault injection
    /// ([`MemoryBackend::report_disconnect`](super::MemoryBackend::report_disconnect)).
    async fn next_event(&self) -> SessionEvent {
        let mut reported = self.inner.disconnects.subscribe();
        let broke = async {
            match reported.changed().await {
                Ok(()) => SessionEvent::Disconnected,
                // The sender lives as long as the cluster, which this session holds.
                Err(_) => std::future::pending().await,
            }
        };
        // Expired on the "cluster" (its TTL passed, `expire_session`): told at once, as etcd's
        // keep-alive stream and ZooKeeper's session events tell theirs.
        let expired = async {
            self.wait_until(|st| !st.sessions.get(&self.id).is_some_and(|s| s.alive))
                .await;
            SessionEvent::Expired
        };
        match crate::race::race(broke, expired).await {
            crate::race::First::Left(ev) | crate::race::First::Right(ev) => ev,
        }
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
        drop(st);
        self.inner.stop_before_reply(super::faults::Request::Create);
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
        drop(st);
        self.inner.stop_before_reply(super::faults::Request::Create);
        self.inner.lose_reply(&self.inner.lost_replies, "create")?;
        Ok(Some(entries))
    }

    async fn wait(&self, own: &Entry, target: &Peer) -> Result<()> {
        // Until the target goes, or our own entry does (deleted by someone else meanwhile: the
        // wait fails at once; the real backends notice it later, when the target goes or at
        // their next look at the queue).
        self.wait_until(|st| {
            st.same(&own.key, own.order).is_none() || st.same(&target.key, target.order).is_none()
        })
        .await;
        if self.inner.lock().same(&own.key, own.order).is_none() {
            return Err(Error::EntryVanished {
                key: own.key.clone(),
            });
        }
        Ok(())
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
        if self
            .inner
            .refused_removes
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok()
        {
            return Err(Error::PermissionDenied {
                backend: NAME,
                op: "remove",
                source: "refused (fault injection)".into(),
            });
        }
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
        self.inner.read_fails()?;
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
        self.inner.read_fails()?;
        let found = self.inspect_now(queue);
        self.inner
            .stop_before_reply(super::faults::Request::Inspect);
        Ok(found)
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
        self.inner.read_fails()?;
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
