//! One ZooKeeper session: heartbeat, session events, close. The queue operations live in
//! `queue.rs`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use fencelock::backend::{BackendSession, Entry, QueueId, SessionEvent};
use fencelock::{Error, LostReason, Result};
use tokio::sync::{mpsc, Mutex as AsyncMutex};
use tokio::time::Instant;
use tracing::{debug, warn};
use uuid::Uuid;
use zookeeper_client as zk;

use crate::error::{self, state_error};
use crate::Inner;

/// How long [`close`](BackendSession::close) waits for the server to confirm the end of the
/// session at most.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// One ZooKeeper session, as a [`BackendSession`]. Usually driven by a
/// [`fencelock::Session`]; made by [`crate::ZooKeeperBackend::session`] or
/// [`Backend::open_session`](fencelock::backend::Backend::open_session).
///
/// Every entry it creates is an ephemeral node owned by this session: closing or expiring the
/// session deletes all of them at once. Dropping it closes the session too.
///
/// **Heartbeat contract.** The ZooKeeper client pings the server by itself, which would keep
/// the session alive for as long as the process runs, even after fencelock's heartbeat
/// stopped. To keep fencelock's contract (a session lives only while its heartbeat runs: the
/// entries of an owner that stopped heartbeating go after the TTL), the session closes itself
/// when [`keep_alive`](BackendSession::keep_alive) has not been called for one TTL. A
/// [`fencelock::Session`] calls it every TTL/3; direct users of this type must do the same.
pub struct ZooKeeperSession {
    pub(crate) backend: Arc<Inner>,
    /// The client while the session is open; dropping its last clone closes the session.
    client: Arc<RwLock<Slot>>,
    /// When `keep_alive` was last called (or the session opened).
    last_beat: Arc<StdMutex<Instant>>,
    pub(crate) id: i64,
    ttl: Duration,
    /// A template: clone it and consume its current state to watch for later changes.
    state: zk::StateWatcher,
    events: AsyncMutex<mpsc::UnboundedReceiver<SessionEvent>>,
    /// Enqueue attempts whose create was sent: `None` while the outcome is unknown (the reply
    /// may have been lost), `Some` once the node is known.
    pub(crate) attempts: StdMutex<HashMap<Uuid, Option<Entry>>>,
    /// The predecessor of an entry that did not head the queue, by the entry's key, as the
    /// enqueue's own listing saw it: answers the `predecessor` call that follows without a
    /// second listing (taken once; a stale one only makes that wait end at once).
    pub(crate) predecessors: StdMutex<HashMap<String, Entry>>,
    /// Our live entries, by key, each with the children watch on its parent that the
    /// enqueue's listing armed (until a wait on the entry takes it): until that watch fires,
    /// no child of the parent changed, so the entry is still there, and watching it costs no
    /// request of its own.
    pub(crate) own: StdMutex<HashMap<String, Option<zk::OneshotWatcher>>>,
    /// The keys of our latest removed entries (a few): a wait on one of them is over at once
    /// (the delete went out before it), saving the request that would only learn so.
    pub(crate) removed: StdMutex<std::collections::VecDeque<String>>,
    /// The queues (parent paths) where our latest enqueue found others ahead: there the
    /// children watch is not armed (see `own`), as other waiters would fire it at once.
    pub(crate) contended: StdMutex<std::collections::HashSet<String>>,
}

impl fmt::Debug for ZooKeeperSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperSession")
            .field("id", &self.id())
            .field("ttl", &self.ttl)
            .field("state", &self.state.peek_state())
            .finish()
    }
}

impl ZooKeeperSession {
    pub(crate) fn new(backend: Arc<Inner>, client: zk::Client) -> Self {
        let id = client.session_id().0;
        let ttl = client.session_timeout();
        let state = client.state_watcher();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(forward_events(state.clone(), tx));
        let client = Arc::new(RwLock::new(Slot::Open(client)));
        let last_beat = Arc::new(StdMutex::new(Instant::now()));
        tokio::spawn(watchdog(
            Arc::downgrade(&client),
            Arc::downgrade(&last_beat),
            ttl,
            id,
        ));
        ZooKeeperSession {
            backend,
            client,
            last_beat,
            id,
            ttl,
            state,
            events: AsyncMutex::new(rx),
            attempts: StdMutex::new(HashMap::new()),
            predecessors: StdMutex::new(HashMap::new()),
            own: StdMutex::new(HashMap::new()),
            removed: StdMutex::new(std::collections::VecDeque::new()),
            contended: StdMutex::new(std::collections::HashSet::new()),
        }
    }

    /// A clone of the client for one operation, or the reason there is none. Operations must
    /// not keep it across long waits (watches), so that [`close`](BackendSession::close)
    /// really ends the session.
    pub(crate) fn client(&self) -> Result<zk::Client> {
        match &*self.client.read().unwrap() {
            Slot::Open(c) => Ok(c.clone()),
            Slot::Gone(reason) => Err(Error::SessionLost(*reason)),
        }
    }

    /// Resolves with an error when the session state breaks an ongoing wait: a disconnect
    /// *after* this call (temporary), or a terminal state (the session is lost). A connection
    /// that is down already when this is called does not count: requests sent now wait for
    /// the reconnection, and watches set then are valid.
    pub(crate) fn broken(&self, op: &'static str) -> impl Future<Output = Error> + Send + 'static {
        let mut watcher = self.state.clone();
        let now = watcher.state();
        async move {
            if now.is_terminated() {
                if let Some(e) = state_error(op, now) {
                    return e;
                }
            }
            loop {
                let state = watcher.changed().await;
                if let Some(e) = state_error(op, state) {
                    return e;
                }
            }
        }
    }

    /// The session's current state as the client knows it.
    pub fn state(&self) -> zk::SessionState {
        self.state.peek_state()
    }
}

/// The client of an open session, or why there is none.
enum Slot {
    Open(zk::Client),
    Gone(LostReason),
}

impl Slot {
    /// Takes the client out (closing the session once its clones are gone), leaving `reason`.
    fn take(&mut self, reason: LostReason) -> Option<zk::Client> {
        match std::mem::replace(self, Slot::Gone(reason)) {
            Slot::Open(c) => Some(c),
            Slot::Gone(r) => {
                *self = Slot::Gone(r);
                None
            }
        }
    }
}

/// Closes the session when `keep_alive` has not been called for `ttl` (see the heartbeat
/// contract on [`ZooKeeperSession`]). Ends with the session.
async fn watchdog(
    client: Weak<RwLock<Slot>>,
    last_beat: Weak<StdMutex<Instant>>,
    ttl: Duration,
    id: i64,
) {
    loop {
        let Some(last) = last_beat.upgrade().map(|b| *b.lock().unwrap()) else {
            return;
        };
        if Instant::now() >= last + ttl {
            let Some(client) = client.upgrade() else {
                return;
            };
            let taken = client.write().unwrap().take(LostReason::Expired);
            if taken.is_some() {
                warn!(session = %format!("{:x}", id as u64), ?ttl, "no heartbeat for a whole ttl: closing the ZooKeeper session, as the cluster would expire it");
            }
            return;
        }
        if client
            .upgrade()
            .is_none_or(|c| matches!(*c.read().unwrap(), Slot::Gone(_)))
        {
            return; // closed
        }
        tokio::time::sleep_until(last + ttl).await;
    }
}

/// Forwards the client's session states as [`SessionEvent`]s until a terminal state.
async fn forward_events(mut watcher: zk::StateWatcher, tx: mpsc::UnboundedSender<SessionEvent>) {
    let mut disconnected = matches!(watcher.state(), zk::SessionState::Disconnected);
    loop {
        let state = watcher.changed().await;
        let event = match state {
            zk::SessionState::Disconnected => {
                disconnected = true;
                Some(SessionEvent::Disconnected)
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                std::mem::take(&mut disconnected).then_some(SessionEvent::Reconnected)
            }
            s if s.is_terminated() => Some(SessionEvent::Expired),
            _ => None,
        };
        debug!(?state, "zookeeper session state");
        if let Some(event) = event {
            if tx.send(event).is_err() {
                return;
            }
        }
        if state.is_terminated() {
            return;
        }
    }
}

#[async_trait]
impl BackendSession for ZooKeeperSession {
    fn id(&self) -> String {
        format!("{:x}", self.id as u64)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn keep_alive(&self) -> Result<()> {
        const OP: &str = "keep-alive";
        *self.last_beat.lock().unwrap() = Instant::now();
        let client = self.client()?;
        // Fail fast while disconnected: the request would only wait for the reconnection.
        if let Some(e) = state_error(OP, self.state.peek_state()) {
            return Err(e);
        }
        // `sync` rather than a plain read: the server we are connected to answers only after
        // a round trip to the leader, having applied every transaction the leader committed
        // before, our session's close included if the leader had expired it. So a reply
        // proves the session alive at the leader after this call started, even when our
        // server is a follower cut off from the leader (it would keep serving reads for a
        // while). Unlike a write, it costs no transaction.
        let res = client.sync("/").await;
        res.map_err(|e| error::map(OP, e))
    }

    async fn next_event(&self) -> SessionEvent {
        let mut rx = self.events.lock().await;
        match rx.recv().await {
            Some(event) => event,
            None => futures::future::pending().await,
        }
    }

    async fn enqueue(&self, queue: &QueueId, attempt: Uuid, value: &[u8]) -> Result<(Entry, bool)> {
        self.enqueue_entry(queue, attempt, value).await
    }

    async fn predecessor(&self, queue: &QueueId, entry: &Entry) -> Result<Option<Entry>> {
        self.predecessor_of(queue, entry).await
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        self.wait_node_gone(entry).await
    }

    async fn remove(&self, entry: &Entry) -> Result<bool> {
        self.remove_entry(entry).await
    }

    async fn abandon(&self, queue: &QueueId, attempt: Uuid) -> Result<()> {
        self.abandon_attempt(queue, attempt).await
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        self.set_entry_value(entry, value).await
    }

    async fn head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> {
        self.queue_head(queue).await
    }

    async fn wait_queue_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()> {
        self.wait_head_change(queue, seen).await
    }

    async fn list(&self, namespace: &str) -> Result<Vec<String>> {
        self.list_entries(namespace).await
    }

    async fn close(&self) -> Result<()> {
        let client = self.client.write().unwrap().take(LostReason::Closed);
        let Some(client) = client else { return Ok(()) };
        let mut watcher = self.state.clone();
        drop(client); // the last clone: the client sends CloseSession
        let closed = async {
            loop {
                if watcher.state().is_terminated() {
                    return;
                }
                watcher.changed().await;
            }
        };
        if tokio::time::timeout(CLOSE_WAIT, closed).await.is_err() {
            warn!(session = %self.id(), "the close of the ZooKeeper session was not confirmed; it expires after its timeout");
        } else {
            debug!(session = %self.id(), "zookeeper session closed");
        }
        Ok(())
    }
}
