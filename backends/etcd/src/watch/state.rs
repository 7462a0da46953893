//! What the watches of one session share: each key's watch and waiters, the streams, and
//! the state the watcher's tasks hold together.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use etcd_client::{Client, WatchRequestSender};
use fencelock::backend::SessionEvent;
use fencelock::Result;
use tokio::sync::{mpsc, oneshot, Mutex as AsyncMutex, Notify};
use tokio::time::Instant;

use crate::error::temporary;
use crate::rotation::Rotation;

/// A registration waiting for a deletion: woken by one at a revision above `after` (the
/// create revision of the entry it waits on). A retained watch (see [`State::idle`]) may
/// still deliver the deletion of the key's previous entry, which must not wake it.
pub(super) struct Waker {
    pub(super) after: i64,
    pub(super) tx: oneshot::Sender<Result<()>>,
}

/// A created watch: its id, the stream it lives on, and the first revision it covers. Ids are
/// numbered per stream (from 0 on each new stream), so an id alone names a different watch
/// once the stream was replaced: a watch is cancelled on its own stream, never on whichever
/// is current.
#[derive(Clone)]
pub(super) struct WatchRef {
    pub(super) id: i64,
    pub(super) stream: Arc<StdMutex<Stream>>,
    pub(super) sender: Arc<AsyncMutex<WatchRequestSender>>,
    /// The first revision whose deletions it delivers: where a copy of it on a new stream
    /// starts, so that no deletion falls between the two.
    pub(super) start: i64,
}

impl WatchRef {
    /// Cancels the watch on its own stream (nothing to do if that stream is gone).
    pub(super) async fn cancel(self) {
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

/// Cancels watch `id` on its stream, from a task (the caller holds the stream's state).
pub(super) fn cancel_later(sender: &Arc<AsyncMutex<WatchRequestSender>>, id: i64) {
    let sender = sender.clone();
    tokio::spawn(async move {
        let _ = sender.lock().await.cancel(id).await;
    });
}

#[derive(Default)]
pub(super) struct KeyState {
    /// This key's watch, once created.
    pub(super) watch: Option<WatchRef>,
    /// Registrations waiting for the watch to be created.
    pub(super) creating: Vec<oneshot::Sender<Result<()>>>,
    /// The watch is being created again on a new stream (its old stream went silent): its
    /// waiters keep waiting, and a new registration waits for that create instead of sending
    /// one of its own.
    pub(super) moving: bool,
    /// Registrations waiting for the key's deletion.
    pub(super) waiters: Vec<Waker>,
}

impl KeyState {
    /// Whether a registration or a create still needs this key's state.
    pub(super) fn needed(&mut self) -> bool {
        self.waiters.retain(|w| !w.tx.is_closed());
        !self.waiters.is_empty() || !self.creating.is_empty() || self.moving
    }

    /// Tells every registration of the key that its watch is gone (they re-read).
    pub(super) fn fail(self, why: &str) {
        for c in self.creating {
            let _ = c.send(Err(temporary("watch", why)));
        }
        for w in self.waiters {
            let _ = w.tx.send(Err(temporary("watch", why)));
        }
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) keys: HashMap<String, KeyState>,
    /// The one key whose watch is kept with no registration: the last one whose deletion
    /// woke a waiter. In a busy queue a session's predecessor is the same session round
    /// after round, under the same key (derived from its lease), so the next wait finds
    /// its watch there. A watch created anew each round would be a watch created while
    /// other sessions write: etcd then files it as "unsynced" (its start revision, taken
    /// just before, is already past) and delivers its events from a catch-up loop that runs
    /// every 100 ms, so a handoff waited up to 100 ms for its event. A kept watch was
    /// synced long ago. At most one is kept, so a session costs the server at most one
    /// notification it did not wait for: the kept watch is cancelled at the first deletion
    /// that wakes nobody, when another key's watch is kept, or once unused for half the
    /// request bound or so (by its stream's supervisor): a session that waited once leaves
    /// no watch on the server.
    pub(super) idle: Option<String>,
    /// Since when [`idle`](Self::idle) has been kept: unused for a while, it is cancelled.
    pub(super) idle_since: Option<Instant>,
}

impl State {
    /// Removes `key`'s state (and its place as the kept watch, if it was).
    pub(super) fn forget(&mut self, key: &str) -> Option<KeyState> {
        self.unkeep(Some(key));
        self.keys.remove(key)
    }

    /// `key` (any key, if `None`) is no longer the kept watch's: a registration waits on it,
    /// or its state is gone.
    pub(super) fn unkeep(&mut self, key: Option<&str>) {
        if key.is_none_or(|k| self.idle.as_deref() == Some(k)) {
            self.idle = None;
            self.idle_since = None;
        }
    }

    /// Keeps `key`'s watch (its deletion just woke a waiter) for the next wait on it, and
    /// returns the watch kept until now under another key, to be cancelled.
    pub(super) fn keep_idle(&mut self, key: &str) -> Option<WatchRef> {
        self.idle_since = Some(Instant::now());
        match self.idle.replace(key.to_string()) {
            Some(old) if old != key => self.keys.remove(&old).and_then(|ks| ks.watch),
            _ => None,
        }
    }
}

/// Ends the registrations of `keys` with a temporary error (they re-read and register again).
pub(super) fn fail_keys<'a>(
    state: &StdMutex<State>,
    keys: impl IntoIterator<Item = &'a str>,
    why: &str,
) {
    let mut st = state.lock().unwrap();
    for key in keys {
        if let Some(ks) = st.forget(key) {
            ks.fail(why);
        }
    }
}

/// A create request: the key, and the revision to start from (`None`: from now).
pub(super) struct Create {
    pub(super) key: String,
    pub(super) start: Option<i64>,
}

/// What belongs to one watch stream (a broken stream's leftovers never touch the next one).
pub(super) struct Stream {
    /// Creates sent, in order: etcd answers creates in order.
    pub(super) pending: VecDeque<Create>,
    /// Watch ids of this stream.
    pub(super) ids: HashMap<i64, String>,
    /// Set when the stream ended or was given up.
    pub(super) dead: bool,
    /// When the stream last delivered anything (a quiet one with watches is asked for
    /// progress).
    pub(super) heard: Instant,
    /// The member it is on, from its replies' headers.
    pub(super) member: Option<u64>,
    /// Stops the stream's reader when the stream is given up (its watches moved on).
    pub(super) retire: Arc<Notify>,
}

impl Stream {
    pub(super) fn new() -> Self {
        Stream {
            pending: VecDeque::new(),
            ids: HashMap::new(),
            dead: false,
            heard: Instant::now(),
            member: None,
            retire: Arc::new(Notify::new()),
        }
    }

    /// Whether the stream carries a create, or a watch that a registration waits on (the
    /// kept watch alone, [`State::idle`], is not worth a progress request).
    pub(super) fn busy(&self, state: &State) -> bool {
        !self.pending.is_empty()
            || self.ids.values().any(|key| {
                state
                    .keys
                    .get(key)
                    .is_some_and(|ks| ks.waiters.iter().any(|w| !w.tx.is_closed()) || ks.moving)
            })
    }
}

pub(super) struct Conn {
    pub(super) sender: Arc<AsyncMutex<WatchRequestSender>>,
    pub(super) stream: Arc<StdMutex<Stream>>,
}

/// What the watcher's tasks share.
pub(super) struct Inner {
    pub(super) client: Client,
    pub(super) state: Arc<StdMutex<State>>,
    pub(super) conn: AsyncMutex<Option<Conn>>,
    /// Where a broken stream is reported (the session's `Disconnected`).
    pub(super) events: mpsc::UnboundedSender<SessionEvent>,
    /// The client's rotation: a member silent on the stream is taken out of it.
    pub(super) rotation: Arc<Rotation>,
    /// How long a stream may take to answer (the session's request bound).
    pub(super) bound: Duration,
    /// Silent streams whose watches must move, for the task that moves them.
    pub(super) moves: mpsc::UnboundedSender<Arc<StdMutex<Stream>>>,
    /// Set when the session closes: no stream is opened any more (a create waiting for the
    /// stream's lock as the close retired the stream would otherwise open a new one).
    pub(super) shut: std::sync::atomic::AtomicBool,
}

/// Gives up the stream in `conn`: its reader stops and drops its end of the stream, and the
/// server ends the stream and the watches on it. Without this a stream outlived its session:
/// its reader, which holds a sender of the stream, waited on it for ever (a task, a server
/// stream and maybe a watch per session that ever waited, for the life of the process).
pub(super) fn retire(conn: &mut Option<Conn>) {
    if let Some(c) = conn.take() {
        let mut ss = c.stream.lock().unwrap();
        ss.dead = true;
        ss.retire.notify_one();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        retire(self.conn.get_mut());
    }
}
