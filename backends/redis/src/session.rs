//! The one `impl BackendSession` of the Redis backend, as a table of contents: the lifecycle in
//! `lifecycle.rs`, the queue operations in `queue.rs`, the reads in `read.rs`, revocation in
//! `revoke.rs`.

use std::time::Duration;

use async_trait::async_trait;
use fencelock::backend::{
    BackendSession, EnqueueRequest, Enqueued, Entry, EntryInfo, EntryKind, Peer, QueueId,
};
use fencelock::{FencingToken, LostReason, Result};
use uuid::Uuid;

use crate::lifecycle::{self, RedisSession};
use crate::{held, queue, read, revoke};

#[async_trait]
impl BackendSession for RedisSession {
    fn id(&self) -> String {
        self.sid.clone()
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn keep_alive(&self) -> Result<()> {
        crate::heartbeat::keep_alive(self).await
    }

    async fn close(&self) -> Result<()> {
        lifecycle::close(self).await
    }

    async fn enqueue(&self, req: EnqueueRequest<'_>) -> Result<Enqueued> {
        queue::enqueue(self, req).await
    }

    async fn enqueue_all(&self, reqs: &[EnqueueRequest<'_>]) -> Result<Option<Vec<Entry>>> {
        queue::enqueue_all(self, reqs).await
    }

    async fn wait(&self, own: &Entry, target: &Peer) -> Result<()> {
        queue::wait(self, own, target).await
    }

    async fn still_ahead(
        &self,
        own: &Entry,
        queue: &QueueId,
        kind: Option<EntryKind>,
        nearest: usize,
    ) -> Result<Vec<Peer>> {
        queue::still_ahead(self, own, queue, kind, nearest).await
    }

    async fn wait_own_gone(&self, own: &Entry) -> Result<()> {
        held::wait_own_gone(self, own).await
    }

    async fn wait_grant_lost(
        &self,
        own: &Entry,
        queue: &QueueId,
        kind: Option<EntryKind>,
        nearest: usize,
    ) -> Result<LostReason> {
        held::wait_grant_lost(self, own, queue, kind, nearest).await
    }

    async fn remove(&self, entry: &Entry) -> Result<bool> {
        queue::remove(self, entry).await
    }

    async fn abandon(&self, queue: &QueueId, kind: EntryKind, attempt: Uuid) -> Result<()> {
        queue::abandon(self, queue, kind, attempt).await
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        queue::set_value(self, entry, value).await
    }

    async fn head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> {
        read::head(self, queue).await
    }

    async fn wait_queue_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()> {
        read::wait_queue_change(self, queue, seen).await
    }

    async fn inspect(&self, queue: &QueueId) -> Result<Vec<EntryInfo>> {
        read::inspect(self, queue).await
    }

    async fn list(&self, namespace: &str) -> Result<Vec<String>> {
        read::list(self, namespace).await
    }

    async fn request_revoke(&self, key: &str, token: FencingToken) -> Result<bool> {
        revoke::request_revoke(self, key, token).await
    }

    async fn wait_revoke(&self, own: &Entry) -> Result<()> {
        revoke::wait_revoke(self, own).await
    }
}
