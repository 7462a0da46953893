//! One etcd lease per session, kept alive by one keep-alive stream, and the queue operations
//! of the session.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, LeaseKeepAliveResponse,
    LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use fencelock::backend::{
    Ahead, BackendSession, EnqueueRequest, Enqueued, Entry, EntryInfo, EntryKind, Peer, QueueId,
    SessionEvent, REVOKE_MARKER,
};
use fencelock::{Error, FencingToken, Result, SessionEnd};
use tokio::sync::{mpsc, Mutex as AsyncMutex};
use tracing::debug;
use uuid::Uuid;

use crate::error::{map, temporary, unreachable, watch_refused};
use crate::layout::{ahead_range, entry_of, key_of, key_string, peer_of, prefix_of, queue_order};
use crate::rotation::Rotation;
use crate::watch::KeyWatcher;

/// How often [`enqueue_all`](BackendSession::enqueue_all) re-checks queues that changed
/// between its read and its write before it reports them taken.
const ENQUEUE_ALL_TRIES: usize = 3;

/// How often [`head`](BackendSession::head) reads the queue again when the head it found went
/// before its value was read.
const HEAD_READS: usize = 10;

pub(crate) struct EtcdSession {
    client: Client,
    lease: i64,
    ttl: Duration,
    /// How long one request may wait for its answer (see [`request_bound`]).
    bound: Duration,
    /// The client's rotation: a member silent on the keep-alive stream is taken out of it.
    rotation: Arc<Rotation>,
    keeper: AsyncMutex<Option<KeepAlive>>,
    /// Failed keep-alives so far: each failure opens the next stream on the next member of
    /// the rotation. A member that answers with an error ("no leader": say, a follower just
    /// resumed from a pause that has not learnt of the new leader) stays in the rotation, but
    /// the session does not keep asking it alone.
    turn: AtomicU64,
    /// Watches on the keys this session waits for, on one watch stream.
    watcher: KeyWatcher,
    /// What the streams learn by themselves (a broken stream: `Disconnected`).
    events: AsyncMutex<mpsc::UnboundedReceiver<SessionEvent>>,
    events_tx: mpsc::UnboundedSender<SessionEvent>,
}

/// The lease's keep-alive stream: requests go through the keeper; a task reads the replies as
/// they come, so that a broken stream is noticed at once (the session reports `Disconnected`)
/// rather than at the next heartbeat.
struct KeepAlive {
    keeper: LeaseKeeper,
    replies: mpsc::UnboundedReceiver<Result<Option<LeaseKeepAliveResponse>, etcd_client::Error>>,
    /// Set when we drop the stream on purpose (its end is then no disconnect).
    retired: Arc<AtomicBool>,
    /// The endpoint the stream is on: taken out of the rotation if the stream goes silent.
    endpoint: String,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.retired.store(true, Ordering::SeqCst);
    }
}

impl EtcdSession {
    /// Opens the keep-alive stream on an endpoint of the rotation, through a client on that
    /// endpoint alone (see [`Rotation::stream_endpoint`]): etcd-client sends a first keep-alive
    /// and waits for its reply, here at most [`keep_alive_bound`]. Unanswered (the member
    /// hangs), the endpoint is taken out of the rotation, so that the retry goes elsewhere.
    async fn open_keep_alive(&self) -> Result<KeepAlive> {
        let seed = (self.lease as u64).wrapping_add(self.turn.load(Ordering::Relaxed));
        let endpoint = self.rotation.stream_endpoint(seed).await;
        let opened = tokio::time::timeout(keep_alive_bound(self.ttl), async {
            let mut leases = self.rotation.stream_client(&endpoint).await?.lease_client();
            match leases.keep_alive(self.lease).await {
                Ok(opened) => Ok(opened),
                Err(e) => {
                    // Refused (a member killed or restarting): out as a silent one is, or
                    // the retry picks the same endpoint until the monitor notices.
                    if unreachable(&e) {
                        self.rotation.take_out(&self.client, &endpoint).await;
                    }
                    Err(map("keep-alive", e))
                }
            }
        })
        .await;
        let (keeper, mut stream) = match opened {
            Ok(opened) => opened?,
            Err(_) => {
                self.rotation.take_out(&self.client, &endpoint).await;
                return Err(temporary("keep-alive", "the new stream was not answered"));
            }
        };
        let (tx, replies) = mpsc::unbounded_channel();
        let retired = Arc::new(AtomicBool::new(false));
        let (events, gone) = (self.events_tx.clone(), retired.clone());
        tokio::spawn(async move {
            loop {
                let reply = stream.message().await;
                let end = !matches!(reply, Ok(Some(_)));
                if tx.send(reply).is_err() || end {
                    if end && !gone.load(Ordering::SeqCst) {
                        debug!("the keep-alive stream broke");
                        let _ = events.send(SessionEvent::Disconnected);
                    }
                    return;
                }
            }
        });
        Ok(KeepAlive {
            keeper,
            replies,
            retired,
            endpoint,
        })
    }

    /// One keep-alive on `ka` and its reply, within [`keep_alive_bound`]. Unanswered, or
    /// broken with its connection, the stream's endpoint is taken out of the rotation (its
    /// member hangs or died, or the leader it forwards to hangs), so that the retry, which the
    /// heartbeat makes at once, opens a stream on a member that answers; the caller drops the
    /// stream.
    async fn beat(&self, ka: &mut KeepAlive) -> Result<()> {
        let reply = tokio::time::timeout(keep_alive_bound(self.ttl), async {
            ka.keeper
                .keep_alive()
                .await
                .map_err(|e| map("keep-alive", e))?;
            Ok(ka.replies.recv().await)
        })
        .await;
        let reply = match reply {
            Ok(reply) => reply?,
            Err(_) => {
                self.rotation.take_out(&self.client, &ka.endpoint).await;
                return Err(temporary(
                    "keep-alive",
                    "no reply within a sixth of the TTL",
                ));
            }
        };
        match reply {
            Some(Ok(Some(resp))) if resp.ttl() > 0 => Ok(()),
            Some(Ok(Some(_))) => Err(Error::SessionLost(SessionEnd::Expired)),
            Some(Err(e)) => {
                // The stream broke with its member (killed): the retry goes elsewhere.
                if unreachable(&e) {
                    self.rotation.take_out(&self.client, &ka.endpoint).await;
                }
                Err(map("keep-alive", e))
            }
            Some(Ok(None)) | None => Err(temporary("keep-alive", "keep-alive stream ended")),
        }
    }
}

impl std::fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSession")
            .field("lease", &format_args!("{:x}", self.lease))
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// How long one request may wait for its answer: a third of the TTL, at least half a second.
///
/// A request that went to a member just before it died (or hung) is not answered until the
/// connection gives up, seconds later (7 s were measured when the leader was killed): the
/// revocation of a lost session and the lease of its replacement waited that long, and the lock
/// with them. Bounded, the request fails as temporary and its retry goes to a member that
/// answers (the endpoint monitor takes a silent one out of the rotation within about a second).
/// Every request is safe to repeat: a create whose reply was lost is found again by its key.
fn request_bound(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(500))
}

/// How often the session sends a heartbeat, and how long one waits for its reply (as does a
/// new keep-alive stream for its first): a sixth of the TTL.
///
/// Shorter than [`request_bound`] because of the local deadline: at the default safety margin
/// it is 1 s after a confirmed heartbeat's send at the shortest TTL (2 s). A heartbeat sent to a
/// member that hangs is given up a sixth of the TTL after its send, at most a third of the TTL
/// after the last confirmed one, and retried at once on a stream opened on another member:
/// a third of the TTL is left for that retry. (A heartbeat every third of the TTL, waiting a
/// third, would run into the deadline before any retry.) A keep-alive is one message on an
/// open stream: sending it twice as often costs next to nothing.
fn keep_alive_bound(ttl: Duration) -> Duration {
    ttl / 6
}

/// `fut`, or a temporary error once `bound` has passed without an answer.
async fn within<T>(
    bound: Duration,
    op: &'static str,
    fut: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(bound, fut).await {
        Ok(r) => r.map_err(|e| map(op, e)),
        Err(_) => Err(temporary(op, "no answer within a third of the TTL")),
    }
}

impl EtcdSession {
    pub(crate) async fn open(
        mut client: Client,
        rotation: Arc<Rotation>,
        ttl: Duration,
    ) -> Result<Self> {
        // Whole seconds, rounded up (the backend's maximum keeps this within an i64).
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let secs = i64::try_from(secs).map_err(|_| Error::invalid_ttl(ttl, "too long for etcd"))?;
        // A grant whose answer is lost leaves a lease that expires by itself.
        let grant = within(
            request_bound(ttl),
            "lease grant",
            client.lease_grant(secs, None),
        )
        .await?;
        if !grant.error().is_empty() {
            return Err(Error::backend(
                "etcd",
                "lease grant",
                false,
                grant.error().to_string(),
            ));
        }
        let (events_tx, events) = mpsc::unbounded_channel();
        let granted = Duration::from_secs(grant.ttl().max(0) as u64);
        let bound = request_bound(granted.max(ttl));
        Ok(EtcdSession {
            client: client.clone(),
            lease: grant.id(),
            ttl: granted,
            bound,
            rotation: rotation.clone(),
            turn: AtomicU64::new(0),
            keeper: AsyncMutex::new(None),
            watcher: KeyWatcher::new(client.clone(), events_tx.clone(), rotation, bound),
            events: AsyncMutex::new(events),
            events_tx,
        })
    }

    async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse> {
        within(self.bound, op, self.client.kv_client().txn(txn)).await
    }

    /// Reads `key`: its create revision, or `None` if absent.
    async fn create_rev(&self, op: &'static str, key: &str) -> Result<Option<u64>> {
        let mut kv = self.client.kv_client();
        let get = kv.get(key, Some(GetOptions::new().with_keys_only()));
        let resp = within(self.bound, op, get).await?;
        Ok(resp.kvs().first().map(|kv| kv.create_revision() as u64))
    }

    /// A KV client for replies that carry entries' values: up to 1 MB each, so that a few of
    /// them exceed gRPC's default 4 MiB reply limit.
    fn large_kv(&self) -> etcd_client::KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(usize::MAX)
    }

    fn put(&self, key: &str, value: &[u8]) -> TxnOp {
        TxnOp::put(key, value, Some(PutOptions::new().with_lease(self.lease)))
    }
}

/// `create_revision(key) == rev`: the entry is still the same one.
fn same(entry: &Entry) -> Compare {
    Compare::create_revision(entry.key.as_str(), CompareOp::Equal, entry.order as i64)
}

fn keys_only() -> GetOptions {
    GetOptions::new().with_keys_only()
}

fn queue_keys() -> GetOptions {
    GetOptions::new().with_prefix().with_keys_only()
}

/// The range reads of a txn reply, in order.
fn gets(resp: &TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().to_vec()),
            _ => None,
        })
        .collect()
}

#[async_trait]
impl BackendSession for EtcdSession {
    fn id(&self) -> String {
        format!("{:x}", self.lease)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A sixth of the TTL (see [`keep_alive_bound`]).
    fn heartbeat_interval(&self) -> Duration {
        keep_alive_bound(self.ttl)
    }

    async fn keep_alive(&self) -> Result<()> {
        let mut slot = self.keeper.lock().await;
        // Taken out while in flight: if this future is cancelled, or the reply does not come
        // in time, the stream is dropped with it, so a late reply can never confirm a later
        // heartbeat.
        let beaten = match slot.take() {
            // Opening the stream sends keep-alives and waits for their replies.
            None => self.open_keep_alive().await,
            Some(mut ka) => self.beat(&mut ka).await.map(|()| ka),
        };
        match beaten {
            Ok(ka) => {
                *slot = Some(ka);
                Ok(())
            }
            Err(e) => {
                // The next stream on the next member (see `turn`).
                self.turn.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    async fn next_event(&self) -> SessionEvent {
        let mut events = self.events.lock().await;
        match events.recv().await {
            Some(ev) => ev,
            None => std::future::pending().await,
        }
    }

    async fn close(&self) -> Result<()> {
        let mut leases = self.client.lease_client();
        match within(self.bound, "close", leases.revoke(self.lease)).await {
            Ok(_) => Ok(()),
            Err(Error::SessionLost(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn enqueue(&self, req: EnqueueRequest<'_>) -> Result<Enqueued> {
        let key = key_of(req.queue, self.lease, req.kind, req.attempt);
        let prefix = prefix_of(req.queue);
        let Ahead { kind, nearest } = req.ahead;
        // The queue read: only the newest entries when the caller needs only the nearest
        // (ours is the newest of the queue right after its create, in the same txn), so that
        // the reply does not grow with the queue.
        let limited = nearest < usize::MAX;
        let limit = nearest.saturating_add(1);
        let range = ahead_range(req.queue, kind);
        let queue_read = if limited {
            GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(i64::try_from(limit).unwrap_or(i64::MAX))
        } else {
            queue_keys()
        };
        let own_read = TxnOp::get(key.as_str(), Some(keys_only()));
        let queue_read = TxnOp::get(range.as_str(), Some(queue_read));
        // Create if absent (with our lease), else find it again: the key is derived from the
        // lease, so a retry after a lost reply finds our own entry. Either way, read the queue
        // in the same round trip. A create's revision is the txn's: no read of our own key.
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([self.put(&key, req.value), queue_read.clone()])
            .or_else([own_read, queue_read]);
        let resp = self.txn("enqueue", txn).await?;
        let created = resp.succeeded();
        let mut reads = gets(&resp).into_iter();
        let own_rev = if created {
            resp.header().map(|h| h.revision())
        } else {
            reads
                .next()
                .and_then(|own| own.first().map(KeyValue::create_revision))
        };
        let Some(own_rev) = own_rev else {
            // A retry that finds nothing: the put with a dead lease fails instead, so this is
            // unexpected.
            return Err(Error::SessionLost(SessionEnd::Expired));
        };
        let queue = reads
            .next()
            .ok_or_else(|| temporary("enqueue", "unexpected txn reply"))?;
        let entry = entry_of(key, req.kind, own_rev);
        let mut ahead: Vec<Peer> = queue_order(req.queue, &prefix, &queue)
            .into_iter()
            .filter(|(kv, k)| {
                (kv.create_revision() as u64) < entry.order && kind.is_none_or(|want| *k == want)
            })
            .map(peer_of)
            .collect();
        // A limited read may not have reached far enough: our entry was found again rather
        // than created (newer entries came first), or keys of nested locks took up the limit.
        if limited && ahead.len() < nearest && (!created || queue.len() >= limit) {
            ahead = self.still_ahead(&entry, req.queue, kind, nearest).await?;
        }
        Ok(Enqueued::new(entry, ahead))
    }

    async fn enqueue_all(&self, reqs: &[EnqueueRequest<'_>]) -> Result<Option<Vec<Entry>>> {
        let keys: Vec<String> = reqs
            .iter()
            .map(|r| key_of(r.queue, self.lease, r.kind, r.attempt))
            .collect();
        let prefixes: Vec<String> = reqs.iter().map(|r| prefix_of(r.queue)).collect();
        let puts: Vec<TxnOp> = reqs
            .iter()
            .zip(&keys)
            .map(|(r, k)| self.put(k, r.value))
            .collect();
        let own_reads: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(k.as_str(), Some(keys_only())))
            .collect();
        let queue_reads: Vec<TxnOp> = prefixes
            .iter()
            .map(|p| TxnOp::get(p.as_str(), Some(queue_keys())))
            .collect();
        // First: every queue empty (a range compare: no key under the prefix) → create all.
        let empty: Vec<Compare> = prefixes
            .iter()
            .map(|p| Compare::create_revision(p.as_str(), CompareOp::Equal, 0).with_prefix())
            .collect();
        let mut txn = Txn::new()
            .when(empty)
            .and_then([puts.clone(), own_reads.clone()].concat())
            .or_else(queue_reads.clone());
        for _ in 0..ENQUEUE_ALL_TRIES {
            let resp = self.txn("enqueue all", txn).await?;
            let reads = gets(&resp);
            if resp.succeeded() {
                let entries = reads
                    .iter()
                    .zip(keys.iter().zip(reqs))
                    .map(|(kvs, (k, r))| {
                        kvs.first()
                            .map(|kv| entry_of(k.clone(), r.kind, kv.create_revision()))
                            .ok_or(Error::SessionLost(SessionEnd::Expired))
                    })
                    .collect::<Result<Vec<_>>>()?;
                return Ok(Some(entries));
            }
            // A prefix was not empty: taken, unless all it holds is our own entry (a retry) or
            // deeper keys of other locks (`a/b/…` under `a/`).
            let mut must_create = Vec::new();
            for (((kvs, prefix), (key, put)), req) in reads
                .iter()
                .zip(&prefixes)
                .zip(keys.iter().zip(&puts))
                .zip(reqs)
            {
                let direct = queue_order(req.queue, prefix, kvs);
                if direct.iter().any(|(kv, _)| kv.key() != key.as_bytes()) {
                    return Ok(None);
                }
                if direct.is_empty() {
                    must_create.push((key.clone(), put.clone()));
                }
            }
            // Then: nothing under any prefix changed since that read → create what is missing.
            let read_at = resp.header().map_or(0, |h| h.revision());
            let unchanged: Vec<Compare> = prefixes
                .iter()
                .map(|p| {
                    Compare::mod_revision(p.as_str(), CompareOp::Less, read_at + 1).with_prefix()
                })
                .collect();
            let creates: Vec<TxnOp> = must_create.into_iter().map(|(_, put)| put).collect();
            txn = Txn::new()
                .when(unchanged)
                .and_then([creates, own_reads.clone()].concat())
                .or_else(queue_reads.clone());
        }
        Ok(None)
    }

    async fn wait(&self, own: &Entry, target: &Peer) -> Result<()> {
        // Watch the key from now, then read it in a txn that also confirms our own entry: no
        // deletion can slip between the two, and the read costs the same whatever the queue's
        // length (one key, never a range).
        let reg = self.watcher.register(&target.key).await?;
        let txn = Txn::new()
            .when([same(own)])
            .and_then([TxnOp::get(target.key.as_str(), Some(keys_only()))]);
        let resp = self.txn("wait", txn).await?;
        if !resp.succeeded() {
            return Err(Error::EntryVanished {
                key: own.key.clone(),
            });
        }
        let still_there = gets(&resp)
            .first()
            .and_then(|kvs| kvs.first().map(|kv| kv.create_revision() as u64))
            == Some(target.order);
        let res = if still_there {
            reg.wait().await
        } else {
            Ok(())
        };
        self.watcher.prune_if_large().await;
        res
    }

    async fn exists(&self, own: &Entry) -> Result<bool> {
        Ok(self.create_rev("check entry", &own.key).await? == Some(own.order))
    }

    async fn still_ahead(
        &self,
        own: &Entry,
        queue: &QueueId,
        kind: Option<EntryKind>,
        nearest: usize,
    ) -> Result<Vec<Peer>> {
        // Go's `waitDeletes`: the last keys created before ours, by a range read limited to
        // what is needed, in a txn that also confirms our entry. Keys of other locks under the
        // prefix (`a/b/…` under `a/`) take up room in the limit: read more if they did.
        let prefix = prefix_of(queue);
        let range = ahead_range(queue, kind);
        let mut limit = nearest.max(1);
        loop {
            let options = GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_max_create_revision(own.order as i64 - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
            let txn = Txn::new()
                .when([same(own)])
                .and_then([TxnOp::get(range.as_str(), Some(options))]);
            let resp = self.txn("read queue", txn).await?;
            if !resp.succeeded() {
                return Err(Error::EntryVanished {
                    key: own.key.clone(),
                });
            }
            let kvs = gets(&resp).into_iter().next().unwrap_or_default();
            let full = kvs.len() >= limit;
            let mut ahead: Vec<Peer> = queue_order(queue, &prefix, &kvs)
                .into_iter()
                .filter(|(_, k)| kind.is_none_or(|want| *k == want))
                .map(peer_of)
                .collect();
            if ahead.len() >= nearest || !full {
                let skip = ahead.len().saturating_sub(nearest);
                return Ok(ahead.split_off(skip));
            }
            limit = limit.saturating_mul(4);
        }
    }

    async fn wait_own_gone(&self, own: &Entry) -> Result<()> {
        let reg = self.watcher.register(&own.key).await?;
        let res = if self.exists(own).await? {
            reg.wait().await
        } else {
            Ok(())
        };
        self.watcher.prune_if_large().await;
        res
    }

    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let txn = Txn::new()
            .when([same(entry)])
            .and_then([TxnOp::delete(entry.key.as_str(), None)]);
        Ok(self.txn("release", txn).await?.succeeded())
    }

    async fn abandon(&self, queue: &QueueId, kind: EntryKind, attempt: Uuid) -> Result<()> {
        // The key is ours alone (derived from our lease, and the attempt where a session may
        // hold several entries) and the caller holds the session's local slot for this queue,
        // so whatever entry is there belongs to the abandoned attempt. Delete it guarded by its create revision, never unconditionally: a request
        // that reaches the cluster late (sent through a member that died, say) must not delete
        // an entry this session creates afterwards.
        let key = key_of(queue, self.lease, kind, attempt);
        if let Some(rev) = self.create_rev("abandon", &key).await? {
            self.remove(&entry_of(key, kind, rev as i64)).await?;
        }
        Ok(())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        let txn = Txn::new()
            .when([same(entry)])
            .and_then([self.put(&entry.key, value)]);
        Ok(self.txn("proclaim", txn).await?.succeeded())
    }

    async fn head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> {
        // The keys first, then the head's value alone: candidates' values may be up to 1 MB
        // each, and reading them all would cost the whole queue's values per read (and
        // overflow a reply's size limit with a few large ones).
        let prefix = prefix_of(queue);
        let options = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        for _ in 0..HEAD_READS {
            let mut kv = self.client.kv_client();
            let resp = within(
                self.bound,
                "leader",
                kv.get(prefix.as_str(), Some(options.clone())),
            )
            .await?;
            let Some(&(kv, kind)) = queue_order(queue, &prefix, resp.kvs()).first() else {
                return Ok(None);
            };
            let entry = entry_of(key_string(kv), kind, kv.create_revision());
            // By the key's bytes: a foreign key that is not UTF-8 is read back as itself.
            let mut large = self.large_kv();
            let value = within(self.bound, "leader", large.get(kv.key(), None)).await?;
            // Still the same entry (else the head changed in between: read again).
            if let Some(kv) = value
                .kvs()
                .first()
                .filter(|kv| kv.create_revision() as u64 == entry.order)
            {
                return Ok(Some((entry, kv.value().to_vec())));
            }
        }
        Err(temporary("leader", "the queue's head kept changing"))
    }

    async fn wait_queue_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()> {
        let prefix = prefix_of(queue);
        // Opened and created within the request bound (a stream sent to a member that hangs
        // is given up, and the caller's retry goes elsewhere).
        let mut watches = self
            .client
            .watch_client()
            .max_decoding_message_size(usize::MAX);
        let options = etcd_client::WatchOptions::new().with_prefix();
        let opened = watches.watch(prefix.as_str(), Some(options));
        let mut stream = within(self.bound, "observe", opened).await?;
        match within(self.bound, "observe", stream.message()).await? {
            Some(r) if r.created() && !r.canceled() => {}
            Some(r) if r.canceled() => return Err(watch_refused(r.cancel_reason())),
            _ => return Err(temporary("observe", "watch was not created")),
        }
        let now = self.head(queue).await?;
        let same = match (&now, seen) {
            (None, None) => true,
            (Some((e, v)), Some((se, sv))) => e == se && v == sv,
            _ => false,
        };
        if !same {
            return Ok(());
        }
        loop {
            match stream.message().await.map_err(|e| map("observe", e))? {
                Some(r) if r.canceled() => {
                    return Err(temporary("observe", "watch canceled"));
                }
                Some(r) if !r.events().is_empty() => return Ok(()),
                Some(_) => {}
                None => return Err(temporary("observe", "watch ended")),
            }
        }
    }

    async fn inspect(&self, queue: &QueueId) -> Result<Vec<EntryInfo>> {
        let prefix = prefix_of(queue);
        let mut large = self.large_kv();
        let get = large.get(prefix.as_str(), Some(GetOptions::new().with_prefix()));
        let resp = within(self.bound, "inspect", get).await?;
        Ok(queue_order(queue, &prefix, resp.kvs())
            .into_iter()
            .map(|(kv, kind)| {
                EntryInfo::new(
                    key_string(kv),
                    FencingToken::new(kv.create_revision() as u64),
                    kind,
                    format!("{:x}", kv.lease()),
                    kv.value().to_vec(),
                    // etcd records revisions, not times.
                    None,
                )
            })
            .collect())
    }

    async fn request_revoke(&self, key: &str, token: FencingToken) -> Result<bool> {
        // The holder's lease stays on the key (`ignore_lease`): the request changes the value
        // only, and only of that very entry.
        let txn = Txn::new()
            .when([Compare::create_revision(
                key,
                CompareOp::Equal,
                token.get() as i64,
            )])
            .and_then([TxnOp::put(
                key,
                REVOKE_MARKER,
                Some(PutOptions::new().with_ignore_lease()),
            )]);
        Ok(self.txn("request revoke", txn).await?.succeeded())
    }

    async fn wait_revoke(&self, own: &Entry) -> Result<()> {
        // A watch stream of its own, for as long as a holder awaits `revoke_requested()`: the
        // shared stream watches deletions only.
        let vanished = || Error::EntryVanished {
            key: own.key.clone(),
        };
        let mut watches = self.client.watch_client();
        let opened = watches.watch(own.key.as_str(), None);
        let mut stream = within(self.bound, "watch revoke", opened).await?;
        match within(self.bound, "watch revoke", stream.message()).await? {
            Some(r) if r.created() && !r.canceled() => {}
            Some(r) if r.canceled() => return Err(watch_refused(r.cancel_reason())),
            _ => return Err(temporary("watch revoke", "watch was not created")),
        }
        let mut kv = self.client.kv_client();
        let resp = within(self.bound, "watch revoke", kv.get(own.key.as_str(), None)).await?;
        match resp.kvs().first() {
            Some(kv) if kv.create_revision() as u64 == own.order => {
                if kv.value() == REVOKE_MARKER {
                    return Ok(());
                }
            }
            _ => return Err(vanished()),
        }
        loop {
            let Some(r) = stream.message().await.map_err(|e| map("watch revoke", e))? else {
                return Err(temporary("watch revoke", "watch ended"));
            };
            if r.canceled() {
                return Err(temporary("watch revoke", "watch canceled"));
            }
            for ev in r.events() {
                match (ev.event_type(), ev.kv()) {
                    (EventType::Put, Some(kv)) if kv.create_revision() as u64 == own.order => {
                        if kv.value() == REVOKE_MARKER {
                            return Ok(());
                        }
                    }
                    _ => return Err(vanished()),
                }
            }
        }
    }

    async fn list(&self, namespace: &str) -> Result<Vec<String>> {
        let mut kv = self.client.kv_client();
        let get = kv.get(format!("{namespace}/"), Some(queue_keys()));
        let resp = within(self.bound, "list", get).await?;
        // A foreign key that is not UTF-8 is left out (fencelock's names are UTF-8): shown
        // lossily it would pass for a queue that no read can find.
        let mut keys: Vec<String> = resp
            .kvs()
            .iter()
            .filter_map(|kv| kv.key_str().ok().map(str::to_string))
            .collect();
        keys.sort();
        Ok(keys)
    }
}
