//! Watches on predecessor keys, multiplexed on one etcd watch stream per session.
//!
//! A waiter watches only the key of its predecessor (and a holder only its own key), from the
//! moment the watch is created — never from a past revision, which etcd serves from a slow
//! catch-up loop. All those watches share one gRPC stream per session: creating one costs a
//! message on an open stream, not a new stream.
//!
//! A stream stays on the member it was opened on. If that member hangs (a stopped or stalled
//! process still accepts connections), the stream goes silent and its waiters would sleep
//! until HTTP/2 keep-alive gives up, seconds later. So a stream that carries watches and has
//! been quiet for a while is asked for progress; unanswered within the request bound, it is
//! dropped, its member taken out of the client's rotation, and its watches created again on a
//! new stream from the revision each one covered from: every deletion since is delivered
//! (etcd replays it), none is missed, and the waiters keep waiting undisturbed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use etcd_client::{
    Client, EventType, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponseStream,
};
use fencelock::backend::SessionEvent;
use fencelock::{Error, Result};
use tokio::sync::{mpsc, oneshot, Mutex as AsyncMutex, Notify};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::error::{map, temporary, watch_refused};
use crate::rotation::Rotation;

type Waker = oneshot::Sender<Result<()>>;

/// A created watch: its id, the stream it lives on, and the first revision it covers. Ids are
/// numbered per stream (from 0 on each new stream), so an id alone names a different watch
/// once the stream was replaced: a watch is cancelled on its own stream, never on whichever
/// is current.
#[derive(Clone)]
struct WatchRef {
    id: i64,
    stream: Arc<StdMutex<Stream>>,
    sender: Arc<AsyncMutex<WatchRequestSender>>,
    /// The first revision whose deletions it delivers: where a copy of it on a new stream
    /// starts, so that no deletion falls between the two.
    start: i64,
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
    /// The watch is being created again on a new stream (its old stream went silent): its
    /// waiters keep waiting, and a new registration waits for that create instead of sending
    /// one of its own.
    moving: bool,
    /// Registrations waiting for the key's deletion.
    waiters: Vec<Waker>,
}

impl KeyState {
    /// Whether a registration or a create still needs this key's state.
    fn needed(&mut self) -> bool {
        self.waiters.retain(|w| !w.is_closed());
        !self.waiters.is_empty() || !self.creating.is_empty() || self.moving
    }

    /// Tells every registration of the key that its watch is gone (they re-read).
    fn fail(self, why: &str) {
        for c in self.creating {
            let _ = c.send(Err(temporary("watch", why)));
        }
        for w in self.waiters {
            let _ = w.send(Err(temporary("watch", why)));
        }
    }
}

#[derive(Default)]
struct State {
    keys: HashMap<String, KeyState>,
}

/// A create request: the key, and the revision to start from (`None`: from now).
struct Create {
    key: String,
    start: Option<i64>,
}

/// What belongs to one watch stream (a broken stream's leftovers never touch the next one).
struct Stream {
    /// Creates sent, in order: etcd answers creates in order.
    pending: VecDeque<Create>,
    /// Watch ids of this stream.
    ids: HashMap<i64, String>,
    /// Set when the stream ended or was given up.
    dead: bool,
    /// When the stream last delivered anything (a quiet one with watches is asked for
    /// progress).
    heard: Instant,
    /// The member it is on, from its replies' headers.
    member: Option<u64>,
    /// Stops the stream's reader when the stream is given up (its watches moved on).
    retire: Arc<Notify>,
}

impl Stream {
    fn new() -> Self {
        Stream {
            pending: VecDeque::new(),
            ids: HashMap::new(),
            dead: false,
            heard: Instant::now(),
            member: None,
            retire: Arc::new(Notify::new()),
        }
    }

    /// Whether the stream carries a watch or a create.
    fn busy(&self) -> bool {
        !self.ids.is_empty() || !self.pending.is_empty()
    }
}

struct Conn {
    sender: Arc<AsyncMutex<WatchRequestSender>>,
    stream: Arc<StdMutex<Stream>>,
}

/// What the watcher's tasks share.
struct Inner {
    client: Client,
    state: Arc<StdMutex<State>>,
    conn: AsyncMutex<Option<Conn>>,
    /// Where a broken stream is reported (the session's `Disconnected`).
    events: mpsc::UnboundedSender<SessionEvent>,
    /// The client's rotation: a member silent on the stream is taken out of it.
    rotation: Arc<Rotation>,
    /// How long a stream may take to answer (the session's request bound).
    bound: Duration,
    /// Silent streams whose watches must move, for the task that moves them.
    moves: mpsc::UnboundedSender<Arc<StdMutex<Stream>>>,
}

/// One watch stream per session, carrying a watch per awaited key.
pub(crate) struct KeyWatcher {
    inner: Arc<Inner>,
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
            if ks.needed() {
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
    /// A watcher whose streams must answer within `bound` (the session's request bound).
    pub(crate) fn new(
        client: Client,
        events: mpsc::UnboundedSender<SessionEvent>,
        rotation: Arc<Rotation>,
        bound: Duration,
    ) -> Self {
        let (moves, silent) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            client,
            state: Arc::default(),
            conn: AsyncMutex::new(None),
            events,
            rotation,
            bound,
            moves,
        });
        tokio::spawn(mover(Arc::downgrade(&inner), silent));
        KeyWatcher { inner }
    }

    /// Registers interest in the deletion of `key` and returns once a watch on it is
    /// established: every deletion after this returns is delivered. The caller must then read
    /// the key once, to catch a deletion that happened before.
    pub(crate) async fn register(&self, key: &str) -> Result<Registration> {
        let (tx, rx) = oneshot::channel();
        let (created_tx, created_rx) = oneshot::channel();
        let must_create = {
            let mut st = self.inner.state.lock().unwrap();
            let ks = st.keys.entry(key.to_string()).or_default();
            ks.waiters.retain(|w| !w.is_closed());
            ks.waiters.push(tx);
            if ks.watch.is_some() {
                let _ = created_tx.send(Ok(()));
                false
            } else {
                let first = ks.creating.is_empty() && !ks.moving;
                ks.creating.push(created_tx);
                first
            }
        };
        if must_create {
            // The create runs as a task of its own: a caller dropped half way must not leave
            // a key in `pending` whose request never went out (the FIFO of created replies
            // would then name the wrong keys).
            let inner = self.inner.clone();
            let k = key.to_string();
            let sent = tokio::spawn(async move {
                let create = Create {
                    key: k.clone(),
                    start: None,
                };
                let r = send_creates(&inner, &mut *inner.conn.lock().await, vec![create]).await;
                if let Err(e) = &r {
                    fail_keys(&inner.state, [k.as_str()], &e.to_string());
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
            state: self.inner.state.clone(),
        };
        match created_rx.await {
            Ok(Ok(())) => Ok(registration),
            Ok(Err(e)) => {
                if !matches!(e, Error::PermissionDenied { .. }) {
                    // A watch refused for an expired token: a unary request refreshes the
                    // token (watches cannot), so that the retry is created.
                    let _ = self.inner.client.kv_client().get(key, None).await;
                }
                Err(e)
            }
            Err(_) => Err(temporary("watch", "watch stream closed")),
        }
    }

    /// Cancels watches whose key has no waiter left, once more than a few are idle.
    pub(crate) async fn prune_if_large(&self) {
        if self.inner.state.lock().unwrap().keys.len() > 32 {
            self.prune().await;
        }
    }

    /// Cancels watches whose key has no waiter left.
    async fn prune(&self) {
        let idle: Vec<WatchRef> = {
            let mut st = self.inner.state.lock().unwrap();
            let mut idle = Vec::new();
            st.keys.retain(|_, ks| {
                let keep = ks.needed();
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
    let retire = stream.lock().unwrap().retire.clone();
    loop {
        let message = tokio::select! {
            m = responses.message() => m,
            // Given up: what it still carries (nothing once its watches moved) is failed.
            () = retire.notified() => break,
        };
        let resp = match message {
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
        if ss.dead {
            break;
        }
        ss.heard = Instant::now();
        if let Some(h) = resp.header() {
            ss.member = Some(h.member_id());
        }
        let mut st = state.lock().unwrap();
        if resp.created() {
            let Some(create) = ss.pending.pop_front() else {
                continue;
            };
            let key = create.key;
            let ok = !resp.canceled();
            if ok {
                ss.ids.insert(resp.watch_id(), key.clone());
            }
            let Some(ks) = st.keys.get_mut(&key) else {
                // Nobody waits any more: the watch is not needed.
                if ok {
                    ss.ids.remove(&resp.watch_id());
                    cancel_later(&sender, resp.watch_id());
                }
                continue;
            };
            ks.moving = false;
            if !ok {
                if let Some(ks) = st.keys.remove(&key) {
                    for c in ks.creating {
                        let _ = c.send(Err(watch_refused(resp.cancel_reason())));
                    }
                    for w in ks.waiters {
                        let _ = w.send(Err(watch_refused(resp.cancel_reason())));
                    }
                }
                continue;
            }
            // A watch from now covers what follows the revision it was created at.
            let start = create
                .start
                .unwrap_or_else(|| resp.header().map_or(0, |h| h.revision()) + 1);
            ks.watch = Some(WatchRef {
                id: resp.watch_id(),
                stream: stream.clone(),
                sender: sender.clone(),
                start,
            });
            for c in ks.creating.drain(..) {
                let _ = c.send(Ok(()));
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
                        ks.fail("watch canceled");
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
                            cancel_later(&sender, watch.id);
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
    let ss = &mut *ss;
    let mut keys: Vec<String> = ss.pending.drain(..).map(|c| c.key).collect();
    keys.extend(ss.ids.drain().map(|(_, k)| k));
    fail_keys(
        &state,
        keys.iter().map(String::as_str),
        "watch stream broke",
    );
}

/// Cancels watch `id` on its stream, from a task (the caller holds the stream's state).
fn cancel_later(sender: &Arc<AsyncMutex<WatchRequestSender>>, id: i64) {
    let sender = sender.clone();
    tokio::spawn(async move {
        let _ = sender.lock().await.cancel(id).await;
    });
}

/// Asks `stream` for progress whenever it carries watches and has been quiet for half the
/// request bound; a stream that then stays silent for the bound is handed to the [`mover`].
/// Ends with the stream, or with the watcher.
///
/// etcd answers a progress request at once, from the member itself (no consensus involved),
/// so silence means the member, or the path to it, hangs.
async fn supervise(
    inner: Weak<Inner>,
    stream: Arc<StdMutex<Stream>>,
    sender: Arc<AsyncMutex<WatchRequestSender>>,
    bound: Duration,
) {
    let quiet = bound / 2;
    loop {
        let (heard, busy) = {
            let ss = stream.lock().unwrap();
            if ss.dead {
                return;
            }
            (ss.heard, ss.busy())
        };
        if inner.strong_count() == 0 {
            return;
        }
        let now = Instant::now();
        if !busy || now < heard + quiet {
            tokio::time::sleep_until(if busy { heard + quiet } else { now + quiet }).await;
            continue;
        }
        let asked = Instant::now();
        let sent = tokio::time::timeout(bound, async {
            sender.lock().await.request_progress().await
        })
        .await;
        if let Ok(Err(_)) = sent {
            // The stream is closed: its reader reports it.
            return;
        }
        tokio::time::sleep_until(asked + bound).await;
        let silent = {
            let ss = stream.lock().unwrap();
            if ss.dead {
                return;
            }
            ss.heard < asked
        };
        if silent {
            let Some(inner) = inner.upgrade() else { return };
            info!("etcd watch stream silent for {bound:?}: its watches move to a new stream");
            let _ = inner.moves.send(stream);
            return;
        }
    }
}

/// Moves the watches of each silent stream it is handed (see [`move_watches`]), one stream at
/// a time, for as long as the watcher lives.
async fn mover(inner: Weak<Inner>, mut silent: mpsc::UnboundedReceiver<Arc<StdMutex<Stream>>>) {
    while let Some(stream) = silent.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        move_watches(&inner, &stream).await;
    }
}

/// Gives up `old` (silent) and creates its watches again on the current stream, or a new one
/// on a member that answers: each from the revision it covered from, so that a deletion the
/// old stream did not deliver is delivered now. Its waiters keep waiting. If no stream can be
/// had, they are told (temporary): they re-read and register again.
async fn move_watches(inner: &Arc<Inner>, old: &Arc<StdMutex<Stream>>) {
    let mut conn = inner.conn.lock().await;
    let (member, creates) = {
        let mut ss = old.lock().unwrap();
        if ss.dead {
            return;
        }
        ss.dead = true;
        ss.retire.notify_one();
        let mut st = inner.state.lock().unwrap();
        let mut creates = Vec::new();
        for (_, key) in ss.ids.drain() {
            let Some(ks) = st.keys.get_mut(&key) else {
                continue;
            };
            if let Some(w) = ks.watch.take_if(|w| Arc::ptr_eq(&w.stream, old)) {
                ks.moving = true;
                creates.push(Create {
                    key,
                    start: Some(w.start),
                });
            }
        }
        // Creates not answered yet: their registrations have not returned, so a watch from
        // now on the new stream is what they asked for.
        for create in ss.pending.drain(..) {
            if let Some(ks) = st.keys.get_mut(&create.key) {
                ks.moving = true;
                creates.push(create);
            }
        }
        (ss.member, creates)
    };
    if conn.as_ref().is_some_and(|c| Arc::ptr_eq(&c.stream, old)) {
        *conn = None;
    }
    // Out of the rotation first, so that the new stream is opened elsewhere.
    if let Some(member) = member {
        inner.rotation.suspect(&inner.client, member).await;
    }
    if creates.is_empty() {
        return;
    }
    let keys: Vec<String> = creates.iter().map(|c| c.key.clone()).collect();
    if let Err(e) = send_creates(inner, &mut conn, creates).await {
        debug!(error = %e, "cannot move the watches to a new stream");
        fail_keys(
            &inner.state,
            keys.iter().map(String::as_str),
            &e.to_string(),
        );
    }
}

/// Ends the registrations of `keys` with a temporary error (they re-read and register again).
fn fail_keys<'a>(state: &StdMutex<State>, keys: impl IntoIterator<Item = &'a str>, why: &str) {
    let mut st = state.lock().unwrap();
    for key in keys {
        if let Some(ks) = st.keys.remove(key) {
            ks.fail(why);
        }
    }
}

fn options(start: Option<i64>) -> WatchOptions {
    let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    match start {
        Some(rev) => options.with_start_revision(rev),
        None => options,
    }
}

/// Sends `creates` on the current stream, or opens one with them (the current one is dead or
/// there is none). Each step waits at most the request bound: a stream sent to a member that
/// hangs is given up, and the caller's retry goes elsewhere.
async fn send_creates(
    inner: &Arc<Inner>,
    conn: &mut Option<Conn>,
    creates: Vec<Create>,
) -> Result<()> {
    let live = conn
        .as_ref()
        .is_some_and(|c| !c.stream.lock().unwrap().dead);
    let creates = if live {
        creates
    } else {
        open_stream(inner, conn, creates).await?
    };
    if let Some(c) = conn.as_ref() {
        let (sender, stream) = (c.sender.clone(), c.stream.clone());
        for create in creates {
            let (key, start) = (create.key.clone(), create.start);
            {
                let mut ss = stream.lock().unwrap();
                if ss.dead {
                    return Err(temporary("watch", "watch stream broke"));
                }
                ss.pending.push_back(create);
            }
            let sent = tokio::time::timeout(inner.bound, async {
                sender
                    .lock()
                    .await
                    .watch(key.as_str(), Some(options(start)))
                    .await
            })
            .await;
            let failed = match sent {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => map("watch", e),
                Err(_) => temporary("watch", "the watch stream takes no request"),
            };
            // The stream is given up: its reader fails what it carries (the caller this key).
            let mut ss = stream.lock().unwrap();
            ss.pending.retain(|c| c.key != key);
            ss.dead = true;
            ss.retire.notify_one();
            drop(ss);
            *conn = None;
            return Err(failed);
        }
    }
    Ok(())
}

/// Opens a stream (in `conn`) with the first of `creates` as its first request; returns the
/// others, to be sent on it.
async fn open_stream(
    inner: &Arc<Inner>,
    conn: &mut Option<Conn>,
    creates: Vec<Create>,
) -> Result<Vec<Create>> {
    let mut creates = creates.into_iter();
    let Some(first) = creates.next() else {
        return Ok(Vec::new());
    };
    let stream = Arc::new(StdMutex::new(Stream::new()));
    let (key, start) = (first.key.clone(), first.start);
    stream.lock().unwrap().pending.push_back(first);
    let mut watches = inner.client.watch_client();
    let opened = watches.watch(key.as_str(), Some(options(start)));
    let ws = match tokio::time::timeout(inner.bound, opened).await {
        Ok(ws) => ws.map_err(|e| map("watch", e))?,
        Err(_) => return Err(temporary("watch", "the new watch stream was not answered")),
    };
    let (sender, responses) = ws.split();
    let sender = Arc::new(AsyncMutex::new(sender));
    tokio::spawn(read_loop(
        responses,
        inner.state.clone(),
        stream.clone(),
        sender.clone(),
        inner.events.clone(),
    ));
    *conn = Some(Conn {
        sender: sender.clone(),
        stream: stream.clone(),
    });
    tokio::spawn(supervise(
        Arc::downgrade(inner),
        stream,
        sender,
        inner.bound,
    ));
    Ok(creates.collect())
}
