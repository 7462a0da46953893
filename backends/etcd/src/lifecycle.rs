//! The lifecycle of an etcd session: one lease, kept alive by one keep-alive stream, its events
//! and its end; and the txn plumbing that every operation of the session shares (bounded as
//! `request.rs` says).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, LeaseKeepAliveResponse, LeaseKeeper,
    PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use fencelock::backend::{Entry, SessionEvent};
use fencelock::{Error, Result, SessionEnd};
use tokio::sync::{mpsc, Mutex as AsyncMutex};
use tracing::debug;

use crate::error::{map, temporary, unreachable};
use crate::fence::Fence;
use crate::request::{hedged, request_bound, within};
use crate::rotation::Rotation;
use crate::watch::KeyWatcher;

/// One session: a lease, its keep-alive stream, and the watch stream of its waits.
pub(crate) struct EtcdSession {
    pub(crate) client: Client,
    /// The lease: every entry of the session is attached to it.
    pub(crate) lease: i64,
    /// The TTL the cluster granted.
    pub(crate) ttl: Duration,
    /// How long one request may wait for its answer (see [`request_bound`]).
    pub(crate) bound: Duration,
    /// The client's rotation: a member silent on the keep-alive stream is taken out of it.
    pub(crate) rotation: Arc<Rotation>,
    pub(crate) keeper: AsyncMutex<Option<KeepAlive>>,
    /// Failed keep-alives so far: each failure opens the next stream on the next member of
    /// the rotation. A member that answers with an error ("no leader": say, a follower just
    /// resumed from a pause that has not learnt of the new leader) stays in the rotation, but
    /// the session does not keep asking it alone.
    pub(crate) turn: AtomicU64,
    /// Watches on the keys this session waits for, on one watch stream.
    pub(crate) watcher: KeyWatcher,
    /// What the streams learn by themselves (a broken stream: `Disconnected`).
    pub(crate) events: AsyncMutex<mpsc::UnboundedReceiver<SessionEvent>>,
    /// The fence that makes a create applied after it was given up fail.
    pub(crate) fence: Fence,
    pub(crate) events_tx: mpsc::UnboundedSender<SessionEvent>,
    /// When the lease was last found alive after an entry's deletion (see
    /// `queue::lease_gone`): one question serves every deletion of a burst.
    pub(crate) lease_seen: AsyncMutex<Option<std::time::Instant>>,
}

/// The lease's keep-alive stream: requests go through the keeper; a task reads the replies as
/// they come, so that a broken stream is noticed at once (the session reports `Disconnected`)
/// rather than at the next heartbeat.
pub(crate) struct KeepAlive {
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
    /// and waits for its reply ([`suspecting`](Self::suspecting) the member past
    /// [`keep_alive_bound`]).
    async fn open_keep_alive(&self) -> Result<KeepAlive> {
        let seed = (self.lease as u64).wrapping_add(self.turn.load(Ordering::Relaxed));
        let endpoint = self.rotation.stream_endpoint(seed).await;
        let opened = self
            .suspecting(&endpoint, async {
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
        let (keeper, mut stream) = opened?;
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

    /// One keep-alive on `ka` and its reply ([`suspecting`](Self::suspecting) the member past
    /// [`keep_alive_bound`]). Broken with its connection, the stream's endpoint is taken out
    /// of the rotation (its member died), so that the retry, which the heartbeat makes at
    /// once, opens a stream on a member that answers; the caller drops the stream.
    async fn beat(&self, ka: &mut KeepAlive) -> Result<()> {
        let endpoint = ka.endpoint.clone();
        let reply = self
            .suspecting(&endpoint, async {
                ka.keeper
                    .keep_alive()
                    .await
                    .map_err(|e| map("keep-alive", e))?;
                Ok(ka.replies.recv().await)
            })
            .await?;
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

    /// Awaits `reply`, a keep-alive's answer from `endpoint`. Unanswered within
    /// [`keep_alive_bound`], the member is suspected (it hangs, or the leader it forwards to
    /// does): it is taken out of the rotation, so that the copies [`keep_alive`] sends beside
    /// this one, and the streams opened after it, go to other members. The wait goes on all
    /// the same: a slow member's late answer counts ([`keep_alive`] bounds the whole call). A
    /// keep-alive given up at that bound was lost on every link slower than a sixth of the
    /// TTL, and with it the session, at its local deadline.
    async fn suspecting<T>(
        &self,
        endpoint: &str,
        reply: impl std::future::Future<Output = T>,
    ) -> T {
        tokio::pin!(reply);
        match tokio::time::timeout(keep_alive_bound(self.ttl), &mut reply).await {
            Ok(answer) => answer,
            Err(_) => {
                // A task of its own, not awaited here: `reply` may hold (or be queued for) the
                // rotation's lock, which `take_out` takes, and is not polled while this waits;
                // and an answer that comes meanwhile is not kept waiting for the change.
                let (rotation, client) = (self.rotation.clone(), self.client.clone());
                let endpoint = endpoint.to_string();
                tokio::spawn(async move { rotation.take_out(&client, &endpoint).await });
                reply.await
            }
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

/// How often the session sends a heartbeat, and how long one waits for its reply (as does a
/// new keep-alive stream for its first) before its member is suspected: a sixth of the TTL.
///
/// Shorter than [`request_bound`] because of the local deadline: at the default safety margin
/// it is 1 s after a confirmed heartbeat's send at the shortest TTL (2 s). A heartbeat sent to a
/// member that hangs has copies on streams on other members beside it from a quarter of this
/// on ([`keep_alive_hedge`]), and its member is taken out of the rotation at this bound; the
/// heartbeat gives the whole call a third of the TTL. (A heartbeat every third of the TTL,
/// waiting a third, would run into the deadline before any retry.) A keep-alive is one message
/// on an open stream: sending it twice as often costs next to nothing.
pub(crate) fn keep_alive_bound(ttl: Duration) -> Duration {
    ttl / 6
}

/// How long a heartbeat waits for its reply on one stream before it sends the same keep-alive
/// on a new stream, on another member, beside it ([`keep_alive`]): a quarter of
/// [`keep_alive_bound`], at least 50 ms.
///
/// Why: a follower forwards a keep-alive to the leader and waits for that leader's answer for
/// seconds, and the stream's next keep-alive waits behind it. When the leader hangs (paused),
/// every keep-alive a follower forwarded before it learnt of the new leader is lost, and at the
/// shortest TTL the new leader comes (0.5–0.8 s on a loopback cluster) about when the session's
/// deadline does (1 s after the last confirmed heartbeat's send): a copy sent a little after
/// the election reaches the new leader in time, one sent only after a sixth of the TTL often
/// does not. A keep-alive is idempotent, and a new stream costs one message on a connection
/// that is already open.
fn keep_alive_hedge(ttl: Duration) -> Duration {
    (keep_alive_bound(ttl) / 4).max(Duration::from_millis(50))
}

impl EtcdSession {
    pub(crate) async fn open(
        client: Client,
        rotation: Arc<Rotation>,
        ttl: Duration,
    ) -> Result<Self> {
        // Whole seconds, rounded up (the backend's maximum keeps this within an i64).
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let secs = i64::try_from(secs).map_err(|_| Error::invalid_ttl(ttl, "too long for etcd"))?;
        // A grant whose answer is lost leaves a lease that expires by itself.
        let grant = hedged(request_bound(ttl), "lease grant", || {
            let mut client = client.clone();
            async move { client.lease_grant(secs, None).await }
        })
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
            fence: Fence::default(),
            lease_seen: AsyncMutex::new(None),
        })
    }

    pub(crate) async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse> {
        within(self.bound, op, self.client.kv_client().txn(txn)).await
    }

    /// A txn that only compares and reads (it writes in neither branch): [`hedged`] like any
    /// read, since a copy answered late changes nothing.
    pub(crate) async fn read_txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse> {
        hedged(self.bound, op, || {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Reads `key`: its create revision, or `None` if absent.
    pub(crate) async fn create_rev(&self, op: &'static str, key: &str) -> Result<Option<u64>> {
        let resp = hedged(self.bound, op, || {
            let mut kv = self.client.kv_client();
            async move { kv.get(key, Some(GetOptions::new().with_keys_only())).await }
        })
        .await?;
        Ok(resp.kvs().first().map(|kv| kv.create_revision() as u64))
    }

    /// A KV client for replies that carry entries' values: up to 1 MB each, so that a few of
    /// them exceed gRPC's default 4 MiB reply limit.
    pub(crate) fn large_kv(&self) -> etcd_client::KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(usize::MAX)
    }

    pub(crate) fn put(&self, key: &str, value: &[u8]) -> TxnOp {
        TxnOp::put(key, value, Some(PutOptions::new().with_lease(self.lease)))
    }
}

/// `create_revision(key) == rev`: the entry is still the same one.
pub(crate) fn same(entry: &Entry) -> Compare {
    Compare::create_revision(entry.key.as_str(), CompareOp::Equal, entry.order as i64)
}

pub(crate) fn keys_only() -> GetOptions {
    GetOptions::new().with_keys_only()
}

pub(crate) fn queue_keys() -> GetOptions {
    GetOptions::new().with_prefix().with_keys_only()
}

/// The range reads of a txn reply, in order.
pub(crate) fn gets(resp: &TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().to_vec()),
            _ => None,
        })
        .collect()
}

pub(crate) async fn keep_alive(session: &EtcdSession) -> Result<()> {
    use futures::stream::{FuturesUnordered, StreamExt};
    use tokio::time::{sleep_until, Instant};
    let mut slot = session.keeper.lock().await;
    // Taken out while in flight: if this future is cancelled, or the reply does not come
    // before the call ends, the stream is dropped with it, so a late reply can never confirm
    // a later heartbeat.
    let try_on = |ka: Option<KeepAlive>| async move {
        match ka {
            // Opening the stream sends a keep-alive and waits for its reply.
            None => session.open_keep_alive().await,
            Some(mut ka) => session.beat(&mut ka).await.map(|()| ka),
        }
    };
    // Hedged: every [`keep_alive_hedge`] without a reply, the same keep-alive goes on a new
    // stream on the next member beside those in flight; the first reply wins and its stream
    // is kept (the others are dropped, which closes them). Copies go on until the heartbeat
    // gives up on this call (a third of the TTL), which bounds every try: a slow member's
    // late answer counts until then (see `suspecting`). The call ends by itself at half the
    // TTL (for a caller without a bound of its own).
    let every = keep_alive_hedge(session.ttl);
    let last_copy = Instant::now() + 2 * keep_alive_bound(session.ttl);
    let give_up = Instant::now() + 3 * keep_alive_bound(session.ttl);
    let mut next = Instant::now() + every;
    let mut tries = FuturesUnordered::new();
    tries.push(try_on(slot.take()));
    loop {
        tokio::select! {
            biased;
            Some(beaten) = tries.next() => match beaten {
                Ok(ka) => {
                    *slot = Some(ka);
                    return Ok(());
                }
                Err(e) => {
                    // The next stream on the next member (see `turn`).
                    session.turn.fetch_add(1, Ordering::Relaxed);
                    if matches!(e, Error::SessionLost(_)) || tries.is_empty() {
                        return Err(e);
                    }
                }
            },
            () = sleep_until(next), if next < last_copy => {
                session.turn.fetch_add(1, Ordering::Relaxed);
                tries.push(try_on(None));
                next += every;
            }
            () = sleep_until(give_up) => {
                return Err(temporary("keep-alive", "no reply within half the TTL"));
            }
        }
    }
}

pub(crate) async fn next_event(session: &EtcdSession) -> SessionEvent {
    let mut events = session.events.lock().await;
    match events.recv().await {
        Some(ev) => ev,
        None => std::future::pending().await,
    }
}

pub(crate) async fn close(session: &EtcdSession) -> Result<()> {
    session.watcher.shut();
    let revoked = hedged(session.bound, "close", || {
        let mut leases = session.client.lease_client();
        async move { leases.revoke(session.lease).await }
    });
    match revoked.await {
        Ok(_) => Ok(()),
        Err(Error::SessionLost(_)) => Ok(()),
        Err(e) => Err(e),
    }
}
