//! The in-memory backend: the same semantics as etcd and ZooKeeper inside one process.
//!
//! **A test double, never a production backend**: it provides no mutual exclusion between
//! processes. Use it for unit tests of code that takes locks or runs elections, and for the
//! quickstart. Sessions expire after their TTL without heartbeats, exactly like an etcd lease;
//! time is tokio's clock, the sessions' local deadlines included, so tests under
//! `#[tokio::test(start_paused = true)]` run on a virtual clock: `sleep` lets time pass with
//! heartbeats, while `tokio::time::advance` past a session's local deadline plays a process
//! stopped that long (the session is lost). Keys follow the etcd layout
//! `{namespace}/{name}/{session id in hex}`, tokens are a backend-wide revision counter.
//!
//! Differences a test should know of: it accepts TTLs from 10 ms (etcd and ZooKeeper from 2 s
//! on the servers' defaults) and grants the TTL asked for (ZooKeeper negotiates it), and names
//! ZooKeeper refuses (see its backend). Use one `MemoryBackend` per test: one runtime's
//! clock rules its expiries, and a backend shared by tests whose paused clocks differ expires
//! sessions by the wrong one. A session belongs to the runtime that started it (its heartbeat
//! and clean-up run there): end a test with `session.close().await`, or what it held stays
//! taken until its TTL for whoever shares the backend.

mod cluster;
mod faults;
pub use faults::Request;
mod session;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{Backend, BackendSession};
use crate::Result;
use cluster::{Sess, State};
use session::MemorySession;

/// The backend's name, in errors.
const NAME: &str = "memory";

/// The in-memory backend. Clones share the same "cluster".
///
/// ```
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use fencelock::{MemoryBackend, Session};
/// let backend = MemoryBackend::new();
/// let session = Session::builder(backend.clone()).start().await?;
/// let _guard = session.mutex("a")?.lock().await?;
/// assert_eq!(session.list_entries().await?.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

/// The shared "cluster": its state, and a revision counter that wakes every waiter.
#[derive(Debug, Default)]
struct Inner {
    state: StdMutex<State>,
    changed: watch::Sender<u64>,
    /// Fault injection: how many creates are still to be carried out and then answered with a
    /// temporary error, as when a reply is lost on its way back.
    lost_replies: std::sync::atomic::AtomicUsize,
    /// The same for removals (a release, say).
    lost_remove_replies: std::sync::atomic::AtomicUsize,
    /// Signalled at each reply lost that way.
    reply_lost: tokio::sync::Notify,
    /// Fault injection: how many removals (a release, an undo) are still to be refused with a
    /// permanent error, as by a cluster whose ACL no longer allows the delete.
    refused_removes: std::sync::atomic::AtomicUsize,
    /// Fault injection: keep-alives wait (unanswered, not failed) while this is set.
    hold_keep_alives: std::sync::atomic::AtomicBool,
    /// Signalled when a keep-alive starts waiting that way, and when the hold ends.
    keep_alive_held: tokio::sync::Notify,
    keep_alives_released: tokio::sync::Notify,
    /// Fault injection: how many connection breaks were reported; each change is a
    /// `SessionEvent::Disconnected` to every session waiting for an event.
    disconnects: watch::Sender<u64>,
    /// Fault injection: the reply of the next request of this kind is held while the thread
    /// stops for this long.
    stop_before: StdMutex<Option<(faults::Request, std::time::Duration)>>,
    /// Fault injection: reads fail with a temporary error while this is set.
    reads_fail: std::sync::atomic::AtomicBool,
}

impl MemoryBackend {
    /// A new, empty in-memory cluster.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn min_ttl(&self) -> Duration {
        Duration::from_millis(10)
    }

    fn runs_on_tokio_clock(&self) -> bool {
        true
    }

    async fn open_session(&self, ttl: Duration) -> Result<Arc<dyn BackendSession>> {
        let id = {
            let mut st = self.inner.lock();
            st.next_session += 1;
            let id = st.next_session;
            st.sessions.insert(
                id,
                Sess {
                    ttl,
                    expires: Instant::now() + ttl,
                    alive: true,
                },
            );
            id
        };
        // The reaper: expires the session when its TTL runs out without a heartbeat.
        let inner = self.inner.clone();
        tokio::spawn(async move {
            loop {
                let expires = match inner.state.lock().unwrap().sessions.get(&id) {
                    Some(s) if s.alive => s.expires,
                    _ => return,
                };
                tokio::time::sleep_until(expires).await;
                drop(inner.lock()); // expires whatever is due
            }
        });
        self.inner.stop_before_reply(faults::Request::Open);
        Ok(Arc::new(MemorySession {
            inner: self.inner.clone(),
            id,
            ttl,
        }))
    }
}
