//! A session's link to the cluster: one client attached to one server at a time, moved to
//! another server when its server falls silent or drops the connection.
//!
//! zookeeper-client leaves a silent server (one that accepts connections and answers nothing:
//! a paused process, a GC or disk stall) only after its connection timeout, 3/5 of the session
//! timeout, then reconnects to the servers in a freshly shuffled order, possibly the silent one
//! again: the session's local deadline (4/5 of the timeout) often came first. So each client
//! here is given one server, and the session moves by itself, as the Java client under Curator
//! does: a heartbeat unanswered for [`silence`] or a dropped connection attaches a new client
//! to the session through the next server (`Connector::with_session`), the silent one last.
//! The handshake confirms the session at the leader, and a `sync` there makes every write of
//! the session visible before the new client serves (a new client claims no zxid, so a server
//! behind the leader would accept it). Then the new client replaces the old one: operations
//! take it from [`Links::current`], waits in progress wake (see [`Links::moved`]) and watch
//! again through it.
//!
//! Every client is *detached*: dropping one never closes the session. A dropped client whose
//! server comes back may still re-attach the session once, before it ends; the current client
//! then finds its connection closed (`SessionMoved`) and the session moves again. A client
//! that says the session expired is believed only when the cluster confirms it: the session
//! is declared lost when an attach is refused as expired (or by the core's local deadline).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fencelock::backend::{Backoff, Retry, SessionEvent};
use fencelock::{Error, Result, SessionEnd};
use tokio::sync::{mpsc, watch, Mutex as AsyncMutex};
use tracing::{debug, info, warn};
use zookeeper_client as zk;

use crate::connect::{AttachError, Unconfirmed};
use crate::Inner;

/// One client of the session, attached through one server.
pub(crate) struct Link {
    pub(crate) client: zk::Client,
    /// Its server, an index in the configured servers.
    server: usize,
    /// A template: clone it and consume its current state to watch for later changes.
    pub(crate) state: zk::StateWatcher,
}

impl Link {
    fn new(client: zk::Client, server: usize) -> Arc<Self> {
        let state = client.state_watcher();
        Arc::new(Link {
            client,
            server,
            state,
        })
    }
}

/// The current link of a session, or why there is none.
enum Slot {
    Open(Arc<Link>),
    Gone(SessionEnd),
}

/// How a move ended.
#[derive(Debug, PartialEq)]
pub(crate) enum Moved {
    /// The session has a new link (or had one already).
    Done,
    /// No server took the session this time; another try may succeed.
    Failed,
    /// The session ended: the cluster refused it as expired, or it was closed.
    Ended(SessionEnd),
}

/// A heartbeat unanswered for this long moves the session to another server: a sixth of the
/// TTL (at least 250 ms, for a loaded machine's slow replies). A heartbeat is sent every fifth
/// of the TTL and the local deadline is the TTL less its safety margin (a fifth of it, at least
/// 1 s, at most half) after the last confirmed one: the move comes before it (with over a third
/// of the TTL left from a TTL of 4 s up).
pub(crate) fn silence(ttl: Duration) -> Duration {
    (ttl / 6).max(Duration::from_millis(250))
}

/// How long a disconnected client is given to reconnect to its server by itself before the
/// session moves: a twentieth of the TTL, at most [`silence`]. Short: a client has one server,
/// and a server that dropped the connection is usually gone (killed, restarting), while at the
/// shortest TTL the move must leave time for an attach before the local deadline; a blip
/// shorter than this costs no move.
fn reconnect_grace(ttl: Duration) -> Duration {
    (ttl / 20).min(silence(ttl))
}

/// How long one attach to one server may take (a healthy server answers in milliseconds; a
/// follower asks the leader).
fn attach_bound(ttl: Duration) -> Duration {
    (ttl / 5).max(Duration::from_millis(250))
}

/// A session's links: the current one, how many moves there were, and how to move.
pub(crate) struct Links {
    backend: Arc<Inner>,
    /// The session timeout asked for (its clients' connection timeout derives from it).
    requested: Duration,
    /// The negotiated session timeout.
    ttl: Duration,
    /// The session's id and password, to attach new clients to it.
    info: zk::SessionInfo,
    slot: RwLock<Slot>,
    /// Bumped on every move: a wait subscribed before a move wakes and watches again.
    moved: watch::Sender<u64>,
    /// One move at a time.
    moving: AsyncMutex<()>,
    /// The server of the latest link.
    last_server: AtomicUsize,
    /// Whether the latest link was connected when the session ended here.
    ended_connected: AtomicBool,
}

impl Links {
    pub(crate) fn new(
        backend: Arc<Inner>,
        client: zk::Client,
        server: usize,
        requested: Duration,
    ) -> Arc<Self> {
        let info = client.session().clone();
        let ttl = client.session_timeout();
        Arc::new(Links {
            backend,
            requested,
            ttl,
            info,
            slot: RwLock::new(Slot::Open(Link::new(client, server))),
            moved: watch::Sender::new(0),
            moving: AsyncMutex::new(()),
            last_server: AtomicUsize::new(server),
            ended_connected: AtomicBool::new(false),
        })
    }

    /// The current link, or the reason there is none.
    pub(crate) fn current(&self) -> Result<Arc<Link>> {
        match &*self.slot.read().unwrap() {
            Slot::Open(link) => Ok(link.clone()),
            Slot::Gone(reason) => Err(Error::SessionLost(*reason)),
        }
    }

    /// Whether the session is still open here (not closed, not found expired).
    pub(crate) fn is_open(&self) -> bool {
        matches!(&*self.slot.read().unwrap(), Slot::Open(_))
    }

    /// A receiver that sees the next move.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.moved.subscribe()
    }

    /// Ends the session here with `reason`: returns its link if it was open. Later operations
    /// fail with `SessionLost(reason)`.
    pub(crate) fn end(&self, reason: SessionEnd) -> Option<Arc<Link>> {
        let mut slot = self.slot.write().unwrap();
        let link = match std::mem::replace(&mut *slot, Slot::Gone(reason)) {
            Slot::Open(link) => {
                let connected = matches!(
                    link.state.peek_state(),
                    zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
                );
                self.ended_connected.store(connected, Ordering::SeqCst);
                Some(link)
            }
            Slot::Gone(r) => {
                *slot = Slot::Gone(r);
                None
            }
        };
        drop(slot);
        // Waits and the follower wake, and let go of the link: its client ends with its
        // last clone.
        self.moved.send_modify(|n| *n += 1);
        link
    }

    /// The bound on one close (see [`close_on_cluster`](Self::close_on_cluster)):
    /// [`CLOSE_WAIT`](crate::lifecycle::CLOSE_WAIT), and at most half the TTL for a session
    /// that ended while its client was not connected (lost by its deadline, most often: a
    /// one-way partition is one way to get there). Each try that reaches a server without its
    /// answer coming back renews the session there, which then lives a TTL past the close's
    /// end: the bound is part of how long a lock stays taken behind such a partition. A
    /// session closed while connected keeps the whole bound (a reattach through a follower
    /// over TLS or SASL, on a slow but healthy cluster).
    fn close_bound(&self) -> Duration {
        if self.ended_connected.load(Ordering::SeqCst) {
            crate::lifecycle::CLOSE_WAIT
        } else {
            crate::lifecycle::CLOSE_WAIT.min(self.ttl / 2)
        }
    }

    /// Closes the session on the cluster: through its last server first if it was connected
    /// there when the session ended here, last otherwise (it may be the silent server that
    /// cost the session). Tried last while connected, a hung server listed before it cost
    /// every close that server's share of the bound (seconds on every `fencelock` exit).
    /// Within [`close_bound`](Self::close_bound): past it, unconfirmed and unanswered.
    pub(crate) async fn close_on_cluster(&self) -> std::result::Result<(), Unconfirmed> {
        let bound = self.close_bound();
        tokio::time::timeout(bound, self.close_unbounded())
            .await
            .unwrap_or_else(|_| {
                Err(Unconfirmed {
                    error: crate::error::temporary("close", "not confirmed in time".to_string()),
                    unanswered: true,
                })
            })
    }

    /// [`close_on_cluster`](Self::close_on_cluster) without its bound.
    async fn close_unbounded(&self) -> std::result::Result<(), Unconfirmed> {
        let config = &self.backend.config;
        let n = config.each.len().max(1);
        let last = self.last_server.load(Ordering::SeqCst);
        let first = match self.ended_connected.load(Ordering::SeqCst) {
            true => last,
            false => (last + 1) % n,
        };
        // Every server gets its try within one close's bound: with a server's share of the
        // TTL alone (6 s at a TTL of 30 s), a silent first server would take the whole bound on
        // every try, and the close would never reach a server that answers.
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        let per_try = attach_bound(self.ttl)
            .max(Duration::from_secs(1))
            .min(self.close_bound() / n)
            .max(Duration::from_millis(500));
        config
            .close_session(self.requested, self.info.clone(), first, per_try)
            .await
    }

    /// Moves the session off `from` if it is still the current link: attaches a client
    /// through each other server in turn, confirms it with a `sync`, and makes it current.
    /// `from`'s own server is tried too, last, only if its client ended (its own client
    /// retries it otherwise: a second client there would take the session from it). Cancel
    /// safe: a move cancelled midway leaves `from` current.
    pub(crate) async fn move_off(&self, from: &Arc<Link>, why: &'static str) -> Moved {
        let _one = self.moving.lock().await;
        match &*self.slot.read().unwrap() {
            Slot::Open(link) if Arc::ptr_eq(link, from) => {}
            Slot::Open(_) => return Moved::Done,
            Slot::Gone(reason) => return Moved::Ended(*reason),
        }
        let config = &self.backend.config;
        let n = config.each.len();
        let own_too = from.state.peek_state().is_terminated();
        for step in 1..=n {
            let server = (from.server + step) % n;
            if server == from.server && !own_too {
                continue;
            }
            let attempt = async {
                let client = config
                    .attach(self.requested, self.info.clone(), server)
                    .await?;
                // Caught up with the leader: our own writes are visible through it.
                client
                    .sync("/")
                    .await
                    .map_err(AttachError::Failed)
                    .map(|()| client)
            };
            let client = match tokio::time::timeout(attach_bound(self.ttl), attempt).await {
                Ok(Ok(client)) => client,
                Ok(Err(AttachError::Expired)) => {
                    warn!(session = %self.info.id(), "the ZooKeeper cluster says the session expired");
                    self.end(SessionEnd::Expired);
                    return Moved::Ended(SessionEnd::Expired);
                }
                Ok(Err(AttachError::Refused(e))) => {
                    warn!(session = %self.info.id(), server = %config.each[server], error = %e, "this server refused the session");
                    continue;
                }
                Ok(Err(AttachError::Failed(e))) => {
                    debug!(server = %config.each[server], error = %e, "the session did not move to this server");
                    continue;
                }
                Err(_) => {
                    debug!(server = %config.each[server], "the session did not move to this server in time");
                    continue;
                }
            };
            if client.session_timeout() < self.ttl {
                // This server granted the session a shorter timeout (its maxSessionTimeout is
                // lower) and revalidated it so at the leader: the cluster now expires it that
                // long after its last touch, sooner than the local deadline, which rests on
                // the TTL the session started with. Its promise can no longer be kept: it ends
                // here (the cluster expires it by then; its client, detached, sends no close).
                warn!(session = %self.info.id(), server = %config.each[server], timeout = ?client.session_timeout(), ttl = ?self.ttl, "this server shortens the session's timeout: the session ends");
                self.end(SessionEnd::Expired);
                return Moved::Ended(SessionEnd::Expired);
            }
            let mut slot = self.slot.write().unwrap();
            if !matches!(&*slot, Slot::Open(_)) {
                return Moved::Ended(SessionEnd::Closed); // closed meanwhile
            }
            *slot = Slot::Open(Link::new(client, server));
            drop(slot);
            self.last_server.store(server, Ordering::SeqCst);
            self.moved.send_modify(|n| *n += 1);
            info!(session = %self.info.id(), from = %config.each[from.server], to = %config.each[server], why, "the ZooKeeper session moved to another server");
            return Moved::Done;
        }
        Moved::Failed
    }
}

/// Follows the current link's state for the session's life: reports `Disconnected` when it
/// breaks and moves the session to another server (trying again with backoff while none
/// takes it, or until the link recovers by itself), `Reconnected` once a link serves again,
/// and `Expired` when the cluster confirms the session expired. Ends with the session.
pub(crate) async fn follow(links: std::sync::Weak<Links>, tx: mpsc::UnboundedSender<SessionEvent>) {
    let mut down = false;
    let Some(ttl) = links.upgrade().map(|l| l.ttl) else {
        return;
    };
    // A failed move is one event of this loop among others (the link may also recover by
    // itself): the driver gives the pause before the next move and counts it.
    let mut retry = Retry::new(Backoff::capped(silence(ttl))).counted(crate::error::NAME);
    loop {
        let Some(l) = links.upgrade() else { return };
        let Ok(link) = l.current() else { return };
        let mut moved = l.subscribe();
        drop(l);
        let mut state = link.state.clone();
        // Not kept across waits: a link let go of must end with its last clone.
        let link = Arc::downgrade(&link);
        let mut now = state.state();
        if matches!(
            now,
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
        ) {
            if std::mem::take(&mut down) && tx.send(SessionEvent::Reconnected).is_err() {
                return;
            }
            retry.succeeded();
            tokio::select! {
                s = state.changed() => now = s,
                _ = moved.changed() => continue,
            }
            debug!(state = ?now, "zookeeper connection state");
            if matches!(
                now,
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
            ) {
                continue;
            }
        }
        // Broken: disconnected, or the client ended (the session expired, or moved away by
        // an old client: the cluster tells which when we attach).
        if !down {
            down = true;
            if tx.send(SessionEvent::Disconnected).is_err() {
                return;
            }
        }
        if !now.is_terminated() {
            // Disconnected: the client reconnects to its server by itself. Give it a moment
            // (a blip) before moving: two clients re-attaching the session at once take it
            // from each other.
            let back = tokio::time::timeout(reconnect_grace(ttl), async {
                loop {
                    let s = state.changed().await;
                    if !matches!(s, zk::SessionState::Disconnected) {
                        return s;
                    }
                }
            })
            .await;
            if let Ok(s) = back {
                now = s;
                if !now.is_terminated() {
                    continue; // serving again (or moved meanwhile: the loop sees it)
                }
            }
        }
        let Some(l) = links.upgrade() else { return };
        let Some(link) = link.upgrade() else { continue };
        let why = if now.is_terminated() {
            "the client ended"
        } else {
            "the connection broke"
        };
        match l.move_off(&link, why).await {
            Moved::Done => continue,
            Moved::Ended(SessionEnd::Expired) => {
                let _ = tx.send(SessionEvent::Expired);
                return;
            }
            Moved::Ended(_) => return,
            Moved::Failed => {
                drop((l, link));
                // Again after a pause, or sooner if the link recovers by itself.
                // Always `Some`: no give-up instant is set and every failure is accepted.
                let pause = retry
                    .after_failure(&"no server took the session", |_| true)
                    .unwrap_or_default();
                if now.is_terminated() {
                    tokio::time::sleep(pause).await;
                } else {
                    let _ = tokio::time::timeout(pause, state.changed()).await;
                }
            }
        }
    }
}
