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

pub(super) type Waker = oneshot::Sender<Result<()>>;

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
        self.waiters.retain(|w| !w.is_closed());
        !self.waiters.is_empty() || !self.creating.is_empty() || self.moving
    }

    /// Tells every registration of the key that its watch is gone (they re-read).
    pub(super) fn fail(self, why: &str) {
        for c in self.creating {
            let _ = c.send(Err(temporary("watch", why)));
        }
        for w in self.waiters {
            let _ = w.send(Err(temporary("watch", why)));
        }
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) keys: HashMap<String, KeyState>,
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

    /// Whether the stream carries a watch or a create.
    pub(super) fn busy(&self) -> bool {
        !self.ids.is_empty() || !self.pending.is_empty()
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
}
