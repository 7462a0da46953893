//! One ZooKeeper session: its lifecycle (heartbeat, session events, the keep-alive watchdog,
//! close). The one `impl BackendSession` is in `session.rs`, built on this, the queue
//! operations of `queue.rs`, the queue reads of `read.rs` and the watches of `watch.rs`.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use fencelock::backend::{BackendSession, SessionEvent};
use fencelock::{Error, Result, SessionEnd};
use tokio::sync::{mpsc, Mutex as AsyncMutex};
use tokio::time::Instant;
use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::error::{self, state_error};
use crate::link::{self, Links, Moved};
use crate::Inner;

/// How long [`close`](BackendSession::close) waits for the server to confirm the end of the
/// session at most.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// One ZooKeeper session, as a [`BackendSession`].
///
/// Every entry it creates is an ephemeral node owned by this session: closing or expiring the
/// session deletes all of them at once. Dropping it closes the session too.
///
/// It talks to the cluster through one server at a time and moves to another when that one
/// falls silent or drops the connection (see [`crate::link`]).
///
/// **Heartbeat contract** (see [`BackendSession`]). The ZooKeeper client pings the server by
/// itself, which would keep the session alive for as long as the process runs, even after
/// fencelock's heartbeat stopped. To keep the contract (a session lives only while its
/// heartbeat runs: the entries of an owner that stopped heartbeating go after the TTL), the
/// session closes itself when [`keep_alive`](BackendSession::keep_alive) has not been called
/// for one TTL.
pub(crate) struct ZkSession {
    pub(crate) backend: Arc<Inner>,
    links: Arc<Links>,
    /// When `keep_alive` was last called (or the session opened).
    last_beat: Arc<StdMutex<Instant>>,
    pub(crate) id: i64,
    pub(crate) ttl: Duration,
    /// See [`crate::connect::heartbeat_interval`].
    pub(crate) heartbeat: Duration,
    events: AsyncMutex<mpsc::UnboundedReceiver<SessionEvent>>,
    /// The close on the cluster: confirmed, or when it was first tried (callers of `close`
    /// take turns).
    closed: AsyncMutex<Closing>,
    /// The state of the client the close let go of, until it ends: kept for the next close
    /// if the one that let go of it is cancelled while it waits.
    ending: StdMutex<Option<zk::StateWatcher>>,
}

impl fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSession")
            .field("id", &self.id())
            .field("ttl", &self.ttl)
            .field(
                "state",
                &self.links.current().map(|l| l.state.peek_state()).ok(),
            )
            .finish()
    }
}

impl ZkSession {
    /// The session of `client`, connected through server `server`.
    pub(crate) fn new(
        backend: Arc<Inner>,
        client: zk::Client,
        server: usize,
        requested: Duration,
    ) -> Self {
        let id = client.session_id().0;
        let ttl = client.session_timeout();
        let heartbeat = crate::connect::heartbeat_interval(ttl, requested);
        let links = Links::new(backend.clone(), client, server, requested);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(link::follow(Arc::downgrade(&links), tx));
        let last_beat = Arc::new(StdMutex::new(Instant::now()));
        tokio::spawn(watchdog(
            Arc::downgrade(&links),
            Arc::downgrade(&last_beat),
            ttl,
            id,
        ));
        ZkSession {
            backend,
            links,
            last_beat,
            id,
            ttl,
            heartbeat,
            events: AsyncMutex::new(rx),
            closed: AsyncMutex::new(Closing::NotYet),
            ending: StdMutex::new(None),
        }
    }

    /// `fut`, or a temporary error if the session moves to another client first (or ends): a
    /// request sent through the old client may wait on a server the session left (a silent
    /// one) until that client gives up; the core retries it through the new client instead.
    /// Every operation is safe to give up at any await point (a lost reply: see
    /// [`EnqueueRequest::retry`]).
    pub(crate) async fn unless_moved<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut moved = self.links.subscribe();
        tokio::select! {
            biased;
            res = fut => res,
            _ = moved.changed() => Err(error::disconnected(op)),
        }
    }

    /// Ends the session here and on the cluster (each try at most `Links::close_bound`). A
    /// close that every server refused is a temporary error, so that the core tries again
    /// (the cluster may be electing a leader, or down), for one TTL at most. One that went
    /// unanswered is not tried again: its attach may have reached a server (a one-way
    /// partition keeps the answer from us), and renewed the session there, as every try
    /// after it would (behind a one-way partition the next holder waited 2.7 TTLs after the
    /// holder's last heartbeat, black-box round 35). Then the cluster expires it.
    pub(crate) async fn close_once(&self) -> Result<()> {
        // Taken first: a close (the caller's, and the heartbeat task's, which `Session::close`
        // starts too) that found the link ended by the other must wait for that one's client
        // to end, not attach beside it (under load, 2 of 9 test runs saw the caller's close
        // fail so, while the other's went through).
        let mut closed = self.closed.lock().await;
        if let Some(last) = self.links.end(SessionEnd::Closed) {
            *self.ending.lock().unwrap() = Some(last.state.clone());
        }
        // Its client ends once the waits on it woke and let go (the end wakes them): alive,
        // it would take the session back from the closer when the server drops its
        // connection for the closer's, and the close would fail. (Waited for by every close
        // until it has ended: one cancelled meanwhile leaves the wait to the next.)
        let ending = self.ending.lock().unwrap().clone();
        if let Some(mut state) = ending {
            let ended = async {
                while !state.state().is_terminated() {
                    state.changed().await;
                }
            };
            let _ = tokio::time::timeout(link::silence(self.ttl), ended).await;
        }
        let first = match *closed {
            Closing::Done => return Ok(()),
            Closing::NotYet => Instant::now(),
            Closing::Tried(first) => first,
        };
        let u = match self.links.close_on_cluster().await {
            Ok(()) => {
                debug!(session = %self.id(), "zookeeper session closed");
                *closed = Closing::Done;
                return Ok(());
            }
            Err(u) => u,
        };
        // Its cause, not its name: the message read "zookeeper: close failed" (the name again)
        // and said nothing of why.
        let failure = std::error::Error::source(&u.error)
            .map_or_else(|| u.error.to_string(), |c| c.to_string());
        if u.unanswered || first.elapsed() >= self.ttl {
            warn!(session = %self.id(), error = %failure, "the ZooKeeper session could not be closed; it expires after its timeout");
            *closed = Closing::Done;
            return Ok(());
        }
        *closed = Closing::Tried(first);
        Err(error::temporary("close", failure))
    }

    /// The current client for one operation, or the reason there is none. Held through its
    /// link, not cloned (a `zk::Client` clone copies the session's password: an allocation
    /// per request). Operations must not keep it across long waits (watches): the session may move to
    /// another client meanwhile, and [`close`](BackendSession::close) must really end it.
    ///
    /// A client that is reconnecting fails the operation at once (temporary; the core retries
    /// it): zookeeper-client keeps a request made meanwhile and sends it once it reconnects,
    /// and a client replaced by a move may still reconnect, take the session back, and send
    /// it then. A create sent so, after its retry through the new client had created and
    /// found the entry, left a second entry of the session in the queue that nobody knew of:
    /// once the first was released, it held the lock for as long as the session lived.
    pub(crate) fn client(&self) -> Result<LinkClient> {
        let link = self.links.current()?;
        match link.state.peek_state() {
            // Refused credentials are permanent, as the request's own error would say.
            zk::SessionState::AuthFailed => Err(error::map("request", zk::Error::AuthFailed)),
            state => match error::state_error("request", state) {
                Some(e) => Err(e),
                None => Ok(LinkClient(link)),
            },
        }
    }

    /// Resolves with an error when the session state breaks an ongoing wait: a disconnect or
    /// a move to another server *after* this call (temporary: the wait watches again through
    /// the new client), or the end of the session. A connection that is down already when
    /// this is called does not count: requests made now fail at once (see
    /// [`client`](Self::client)) and are retried once it is back.
    pub(crate) fn broken(&self, op: &'static str) -> impl Future<Output = Error> + Send + 'static {
        let mut moved = self.links.subscribe();
        // The state now, not at the first poll: a disconnect in between breaks the wait.
        let watched = self.links.current().map(|link| {
            let mut watcher = link.state.clone();
            let now = watcher.state();
            (watcher, now)
        });
        async move {
            let (mut watcher, now) = match watched {
                Ok(w) => w,
                Err(e) => return e,
            };
            if now.is_terminated() {
                if let Some(e) = state_error(op, now) {
                    return e;
                }
            }
            loop {
                tokio::select! {
                    state = watcher.changed() => {
                        if let Some(e) = state_error(op, state) {
                            return e;
                        }
                    }
                    _ = moved.changed() => return error::disconnected(op),
                }
            }
        }
    }
}

/// How far the close on the cluster got.
enum Closing {
    NotYet,
    /// Tried first at this instant, not confirmed.
    Tried(Instant),
    Done,
}

impl Drop for ZkSession {
    /// A session dropped without [`close`](BackendSession::close) is closed in the background
    /// (its clients are detached: dropping them alone would leave it to expire).
    fn drop(&mut self) {
        if matches!(self.closed.try_lock().as_deref(), Ok(Closing::Done)) {
            return;
        }
        self.links.end(SessionEnd::Closed);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let links = self.links.clone();
            rt.spawn(async move {
                let _ = links.close_on_cluster().await;
            });
        }
    }
}

/// Closes the session when `keep_alive` has not been called for `ttl` (see the heartbeat
/// contract on [`ZkSession`]). Ends with the session.
async fn watchdog(links: Weak<Links>, last_beat: Weak<StdMutex<Instant>>, ttl: Duration, id: i64) {
    loop {
        let Some(last) = last_beat.upgrade().map(|b| *b.lock().unwrap()) else {
            return;
        };
        if Instant::now() >= last + ttl {
            let Some(links) = links.upgrade() else {
                return;
            };
            if links.end(SessionEnd::Expired).is_some() {
                warn!(session = %format!("{:x}", id as u64), ?ttl, "no heartbeat for a whole ttl: closing the ZooKeeper session, as the cluster would expire it");
                // As the cluster would: its entries go now, not a TTL after the client's own
                // last ping.
                let _ = links.close_on_cluster().await;
            }
            return;
        }
        if links.upgrade().is_none_or(|l| !l.is_open()) {
            return; // closed
        }
        tokio::time::sleep_until(last + ttl).await;
    }
}

pub(crate) async fn keep_alive(session: &ZkSession) -> Result<()> {
    const OP: &str = "keep-alive";
    *session.last_beat.lock().unwrap() = Instant::now();
    let link = session.links.current()?;
    // Fail fast while disconnected: the request would only wait for the reconnection.
    if let Some(e) = state_error(OP, link.state.peek_state()) {
        return Err(e);
    }
    // `sync` rather than a plain read: the server we are connected to answers only after
    // a round trip to the leader, having applied every transaction the leader committed
    // before, our session's close included if the leader had expired it. So a reply
    // proves the session alive at the leader after this call started, even when our
    // server is a follower cut off from the leader (it would keep serving reads for a
    // while). Unlike a write, it costs no transaction.
    //
    // Unanswered for a while, the server is silent (paused, stalled): the session moves
    // to another server, in a task of its own so that the heartbeat's own timeout cannot
    // cancel the move halfway; the next heartbeat goes through the new client.
    //
    // A reply that comes after the move began still counts (the core's own patience bounds
    // the wait): the local deadline runs from when this heartbeat was sent, and a slow server
    // (a leader whose disk stalls, so that every `sync` takes longer than the silence) is not
    // a silent one. Thrown away, each heartbeat failed and the session was lost at its
    // deadline, moving from server to server meanwhile.
    let client = link.client.clone();
    let mut sync = std::pin::pin!(client.sync("/"));
    let answered = tokio::time::timeout(link::silence(session.ttl), &mut sync).await;
    match answered {
        Ok(res) => res.map_err(|e| error::map(OP, e)),
        Err(_) => {
            let links = session.links.clone();
            let mut mover =
                tokio::spawn(async move { links.move_off(&link, "silent server").await });
            let moved = tokio::select! {
                biased;
                answer = &mut sync => match answer {
                    Ok(()) => return Ok(()),
                    // Failed (the server dropped the connection): the move decides.
                    Err(_) => mover.await,
                },
                moved = &mut mover => match moved {
                    // No other server took the session: its reply may still come.
                    Ok(Moved::Failed) => {
                        return sync.await.map_err(|_| error::disconnected(OP));
                    }
                    moved => moved,
                },
            };
            match moved {
                Ok(Moved::Ended(reason)) => Err(Error::SessionLost(reason)),
                // Moved: the next heartbeat goes through the new client.
                _ => Err(error::disconnected(OP)),
            }
        }
    }
}

pub(crate) async fn next_event(session: &ZkSession) -> SessionEvent {
    let mut rx = session.events.lock().await;
    match rx.recv().await {
        Some(event) => event,
        None => std::future::pending().await,
    }
}

pub(crate) async fn close(session: &ZkSession) -> Result<()> {
    session.close_once().await
}

/// The client of the link current when an operation started (see [`ZkSession::client`]),
/// used as a `zk::Client`.
pub(crate) struct LinkClient(Arc<crate::link::Link>);

impl std::ops::Deref for LinkClient {
    type Target = zk::Client;

    fn deref(&self) -> &zk::Client {
        &self.0.client
    }
}
