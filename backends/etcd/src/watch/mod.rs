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

mod state;
mod stream;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use etcd_client::Client;
use fencelock::backend::SessionEvent;
use fencelock::{Error, Result};
use tokio::sync::{mpsc, oneshot, Mutex as AsyncMutex};

use crate::error::temporary;
use crate::rotation::Rotation;

use state::*;
use stream::*;

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
/// notify every session that ever waited on that key. The one exception is the watch whose
/// deletion woke it, kept for the next wait on the same key (see [`State::idle`]).
pub(crate) struct Registration {
    /// The watch already covered every deletion of the entry when it was registered (a kept
    /// watch, [`State::idle`], that has delivered nothing since before the entry's creation):
    /// no read is needed to catch a deletion before the registration.
    pub(crate) covered: bool,
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
            if ks.needed() || st.idle.as_deref() == Some(self.key.as_str()) {
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
            shut: Default::default(),
        });
        tokio::spawn(mover(Arc::downgrade(&inner), silent));
        KeyWatcher { inner }
    }

    /// Ends the session's watch stream (the session is closed): every wait on it fails
    /// (temporary), and the server drops the stream with its watches. Also done when the
    /// watcher is dropped; here for a closed session whose handles are kept. A stream being
    /// opened right now is retired by its opener, which finds the watcher shut.
    pub(crate) fn shut(&self) {
        self.inner
            .shut
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut conn) = self.inner.conn.try_lock() {
            retire(&mut conn);
        }
    }

    /// Registers interest in the deletion of the entry under `key` created at revision
    /// `after`, and returns once a watch on the key is established: every deletion after this
    /// returns is delivered. Unless the registration is [`covered`](Registration::covered),
    /// the caller must then read the key once, to catch a deletion that happened before.
    pub(crate) async fn register(&self, key: &str, after: i64) -> Result<Registration> {
        let (tx, rx) = oneshot::channel();
        let (created_tx, created_rx) = oneshot::channel();
        let mut covered = false;
        let must_create = {
            let mut st = self.inner.state.lock().unwrap();
            st.unkeep(Some(key));
            let ks = st.keys.entry(key.to_string()).or_default();
            ks.waiters.retain(|w| !w.tx.is_closed());
            ks.waiters.push(Waker { after, tx });
            if let Some(w) = &ks.watch {
                // A watch delivers every deletion from its start, and its start passes each
                // deletion it delivers: from at most just after the entry's creation, none of
                // the entry's has been delivered, and its deletion will be.
                covered = w.start <= after + 1;
                let _ = created_tx.send(Ok(()));
                false
            } else {
                let first = ks.creating.is_empty() && !ks.moving;
                ks.creating.push(created_tx);
                first
            }
        };
        // Made before the first await: dropped at any point from here, it cancels the watch
        // (or, with the create still on its way, leaves that to the created reply).
        let registration = Registration {
            covered,
            rx: Some(rx),
            key: key.to_string(),
            state: self.inner.state.clone(),
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
            st.unkeep(None);
            idle
        };
        for watch in idle {
            watch.cancel().await;
        }
    }
}
