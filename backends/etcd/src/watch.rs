//! Watches on predecessor keys, multiplexed on one etcd watch stream per session.
//!
//! A waiter watches only the key of its predecessor (and a holder only its own key), from the
//! moment the watch is created — never from a past revision, which etcd serves from a slow
//! catch-up loop. All those watches share one gRPC stream per session: creating one costs a
//! message on an open stream, not a new stream.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};

use etcd_client::{
    Client, EventType, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponseStream,
};
use fencelock::backend::SessionEvent;
use fencelock::{Error, Result};
use tokio::sync::{mpsc, oneshot, Mutex as AsyncMutex};
use tracing::debug;

use crate::error::{map, temporary, watch_refused};

type Waker = oneshot::Sender<Result<()>>;

/// A created watch: its id and the stream it lives on. Ids are numbered per stream (from 0 on
/// each new stream), so an id alone names a different watch once the stream was replaced: a
/// watch is cancelled on its own stream, never on whichever is current.
#[derive(Clone)]
struct WatchRef {
    id: i64,
    stream: Arc<StdMutex<Stream>>,
    sender: Arc<AsyncMutex<WatchRequestSender>>,
}

impl WatchRef {
    /// Cancels the watch on its own stream (nothing to do if that stream is gone).
    async fn cancel(self) {
        {
            let mut ss = self.stream.lock().unwrap();
            if ss.dead {
                return;
            }
            ss.ids.remove(&self.id);
        }
        let _ = self.sender.lock().await.cancel(self.id).await;
    }
}

#[derive(Default)]
struct KeyState {
    /// This key's watch, once created.
    watch: Option<WatchRef>,
    /// Registrations waiting for the watch to be created.
    creating: Vec<oneshot::Sender<Result<()>>>,
    /// Registrations waiting for the key's deletion.
    waiters: Vec<Waker>,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, KeyState>,
}

/// What belongs to one watch stream (a broken stream's leftovers never touch the next one).
#[derive(Default)]
struct Stream {
    /// Keys whose create requests were sent, in order: etcd answers creates in order.
    pending: VecDeque<String>,
    /// Watch ids of this stream.
    ids: HashMap<i64, String>,
    /// Set by the reader when the stream ended.
    dead: bool,
}

struct Conn {
    sender: Arc<AsyncMutex<WatchRequestSender>>,
    stream: Arc<StdMutex<Stream>>,
}

/// One watch stream per session, carrying a watch per awaited key.
pub(crate) struct KeyWatcher {
    client: Client,
    state: Arc<StdMutex<State>>,
    conn: Arc<AsyncMutex<Option<Conn>>>,
    /// Where a broken stream is reported (the session's `Disconnected`).
    events: mpsc::UnboundedSender<SessionEvent>,
}

impl std::fmt::Debug for KeyWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyWatcher").finish_non_exhaustive()
    }
}

/// A registered wait; resolves when the key is deleted (or the stream broke: an error the
/// caller retries after re-reading). Dropped before that (the key was found gone already, the
/// wait was given up), it cancels the key's watch if no other wait needs it: a watch left
/// behind would cost a notification at the key's next deletion, and keys repeat (a session
/// re-creates its own key at each acquisition), so idle watches would make every release
/// notify every session that ever waited on that key.
pub(crate) struct Registration {
    rx: Option<oneshot::Receiver<Result<()>>>,
    key: String,
    state: Arc<StdMutex<State>>,
}

impl Registration {
    pub(crate) async fn wait(mut self) -> Result<()> {
        let rx = self.rx.as_mut().expect("a registration is awaited once");
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(temporary("watch", "watch stream closed")),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        drop(self.rx.take()); // closes our waiter
        let idle = {
            let mut st = self.state.lock().unwrap();
            let Some(ks) = st.keys.get_mut(&self.key) else {
                return;
            };
            ks.waiters.retain(|w| !w.is_closed());
            if !ks.waiters.is_empty() || !ks.creating.is_empty() {
                return;
            }
            st.keys.remove(&self.key).and_then(|ks| ks.watch)
        };
        if let (Some(watch), Ok(rt)) = (idle, tokio::runtime::Handle::try_current()) {
            rt.spawn(watch.cancel());
        }
    }
}

impl KeyWatcher {
    pub(crate) fn new(client: Client, events: mpsc::UnboundedSender<SessionEvent>) -> Self {
        KeyWatcher {
            client,
            state: Arc::default(),
            conn: Arc::new(AsyncMutex::new(None)),
            events,
        }
    }

    /// Registers interest in the deletion of `key` and returns once a watch on it is
    /// established: every deletion after this returns is delivered. The caller must then read
    /// the key once, to catch a deletion that happened before.
    pub(crate) async fn register(&self, key: &str) -> Result<Registration> {
        let (tx, rx) = oneshot::channel();
        let (created_tx, created_rx) = oneshot::channel();
        let must_create = {
            let mut st = self.state.lock().unwrap();
            let ks = st.keys.entry(key.to_string()).or_default();
            ks.waiters.retain(|w| !w.is_closed());
            ks.waiters.push(tx);
            if ks.watch.is_some() {
                let _ = created_tx.send(Ok(()));
                false
            } else {
                let first = ks.creating.is_empty();
                ks.creating.push(created_tx);
                first
            }
        };
        if must_create {
            // The create runs as a task of its own: a caller dropped half way must not leave
            // a key in `pending` whose request never went out (the FIFO of created replies
            // would then name the wrong keys).
            let (client, state, conn) =
                (self.client.clone(), self.state.clone(), self.conn.clone());
            let events = self.events.clone();
            let k = key.to_string();
            let sent = tokio::spawn(async move {
                let r = send_create(&client, &state, &conn, &k, events).await;
                if let Err(e) = &r {
                    fail_key(&state, &k, e);
                }
                r
            });
            match sent.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(temporary("watch", &e.to_string())),
            }
        }
        let registration = Registration {
            rx: Some(rx),
            key: key.to_string(),
            state: self.state.clone(),
        };
        match created_rx.await {
            Ok(Ok(())) => Ok(registration),
            Ok(Err(e)) => {
                if !matches!(e, Error::PermissionDenied { .. }) {
                    // A watch refused for an expired token: a unary request refreshes the
                    // token (watches cannot), so that the retry is created.
                    let _ = self.client.kv_client().get(key, None).await;
                }
                Err(e)
            }
            Err(_) => Err(temporary("watch", "watch stream closed")),
        }
    }

    /// Cancels watches whose key has no waiter left, once more than a few are idle.
    pub(crate) async fn prune_if_large(&self) {
        if self.state.lock().unwrap().keys.len() > 32 {
            self.prune().await;
        }
    }

    /// Cancels watches whose key has no waiter left.
    async fn prune(&self) {
        let idle: Vec<WatchRef> = {
            let mut st = self.state.lock().unwrap();
            let mut idle = Vec::new();
            st.keys.retain(|_, ks| {
                ks.waiters.retain(|w| !w.is_closed());
                let keep = !ks.waiters.is_empty() || !ks.creating.is_empty();
                if !keep {
                    idle.extend(ks.watch.take());
                }
                keep
            });
            idle
        };
        for watch in idle {
            watch.cancel().await;
        }
    }
}

async fn read_loop(
    mut responses: WatchResponseStream,
    state: Arc<StdMutex<State>>,
    stream: Arc<StdMutex<Stream>>,
    sender: Arc<AsyncMutex<WatchRequestSender>>,
    events: mpsc::UnboundedSender<SessionEvent>,
) {
    loop {
        let resp = match responses.message().await {
            Ok(Some(r)) => r,
            Ok(None) => {
                let _ = events.send(SessionEvent::Disconnected);
                break;
            }
            Err(e) => {
                debug!(error = %e, "watch stream broke");
                let _ = events.send(SessionEvent::Disconnected);
                break;
            }
        };
        let mut ss = stream.lock().unwrap();
        let mut st = state.lock().unwrap();
        if resp.created() {
            let Some(key) = ss.pending.pop_front() else {
                continue;
            };
            let ok = !resp.canceled();
            if ok {
                ss.ids.insert(resp.watch_id(), key.clone());
            }
            if let Some(ks) = st.keys.get_mut(&key) {
                if ok {
                    ks.watch = Some(WatchRef {
                        id: resp.watch_id(),
                        stream: stream.clone(),
                        sender: sender.clone(),
                    });
                }
                for c in ks.creating.drain(..) {
                    let _ = c.send(if ok {
                        Ok(())
                    } else {
                        Err(watch_refused(resp.cancel_reason()))
                    });
                }
                if !ok {
                    st.keys.remove(&key);
                }
            }
            continue;
        }
        if resp.canceled() {
            // A watch ended by the server (compaction) or by our cancel: its waiters re-read.
            if let Some(key) = ss.ids.remove(&resp.watch_id()) {
                let ours = st
                    .keys
                    .get(&key)
                    .and_then(|k| k.watch.as_ref())
                    .is_some_and(|w| w.id == resp.watch_id() && Arc::ptr_eq(&w.stream, &stream));
                if ours {
                    if let Some(ks) = st.keys.remove(&key) {
                        for w in ks.waiters {
                            let _ = w.send(Err(temporary("watch", "watch canceled")));
                        }
                    }
                }
            }
            continue;
        }
        for ev in resp.events() {
            if ev.event_type() != EventType::Delete {
                continue;
            }
            let Some(kv) = ev.kv() else { continue };
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            // Wake every waiter of the key and end its watch: a session watches only the
            // keys it is waiting on right now.
            if let Some(ks) = st.keys.get_mut(key) {
                for w in ks.waiters.drain(..) {
                    let _ = w.send(Ok(()));
                }
                if ks.watch.is_some() {
                    if let Some(watch) = st.keys.remove(key).and_then(|ks| ks.watch) {
                        if Arc::ptr_eq(&watch.stream, &stream) {
                            ss.ids.remove(&watch.id);
                            let sender = sender.clone();
                            tokio::spawn(async move {
                                let _ = sender.lock().await.cancel(watch.id).await;
                            });
                        } else {
                            tokio::spawn(watch.cancel());
                        }
                    }
                }
            }
        }
    }
    // The stream is gone: every key it carried (or was creating) re-reads through the core's
    // retry; keys on a newer stream are left alone.
    let mut ss = stream.lock().unwrap();
    ss.dead = true;
    let mut st = state.lock().unwrap();
    let ss = &mut *ss;
    let mut keys: Vec<String> = ss.pending.drain(..).collect();
    keys.extend(ss.ids.drain().map(|(_, k)| k));
    for key in keys {
        if let Some(ks) = st.keys.remove(&key) {
            for c in ks.creating {
                let _ = c.send(Err(temporary("watch", "watch stream broke")));
            }
            for w in ks.waiters {
                let _ = w.send(Err(temporary("watch", "watch stream broke")));
            }
        }
    }
}

fn fail_key(state: &StdMutex<State>, key: &str, e: &fencelock::Error) {
    let mut st = state.lock().unwrap();
    if let Some(ks) = st.keys.remove(key) {
        for c in ks.creating {
            let _ = c.send(Err(temporary("watch", &e.to_string())));
        }
        for w in ks.waiters {
            let _ = w.send(Err(temporary("watch", &e.to_string())));
        }
    }
}

fn options() -> WatchOptions {
    WatchOptions::new().with_filters([WatchFilterType::NoPut])
}

async fn send_create(
    client: &Client,
    state: &Arc<StdMutex<State>>,
    conn: &AsyncMutex<Option<Conn>>,
    key: &str,
    events: mpsc::UnboundedSender<SessionEvent>,
) -> Result<()> {
    let mut conn = conn.lock().await;
    if let Some(c) = conn.as_mut() {
        let live = {
            let mut st = c.stream.lock().unwrap();
            if !st.dead {
                st.pending.push_back(key.to_string());
            }
            !st.dead
        };
        if live {
            let sender = c.sender.clone();
            let sent = sender.lock().await.watch(key, Some(options())).await;
            if let Err(e) = sent {
                let mut st = c.stream.lock().unwrap();
                st.pending.retain(|k| k != key);
                st.dead = true;
                drop(st);
                *conn = None;
                return Err(map("watch", e));
            }
            return Ok(());
        }
    }
    // Open a stream with this key's watch as its first request.
    let stream = Arc::new(StdMutex::new(Stream::default()));
    stream.lock().unwrap().pending.push_back(key.to_string());
    let ws = client
        .watch_client()
        .watch(key, Some(options()))
        .await
        .map_err(|e| map("watch", e))?;
    let (sender, responses) = ws.split();
    let sender = Arc::new(AsyncMutex::new(sender));
    tokio::spawn(read_loop(
        responses,
        state.clone(),
        stream.clone(),
        sender.clone(),
        events,
    ));
    *conn = Some(Conn { sender, stream });
    Ok(())
}
