//! Leader election: the same ordered queue as the mutex, with a value and a long tenure. The
//! fencing token of the leader's entry is its epoch.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures::Stream;
use tracing::Instrument;

use crate::backend::{Entry, QueueId};
use crate::queue::{acquire, with_retry, Held, Wait};
use crate::{Error, FencingToken, LostReason, Result, Session};

/// What is known of the current leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The value the leader published (its address, typically).
    pub value: Vec<u8>,
    /// The leader's epoch: the fencing token of its entry.
    pub epoch: FencingToken,
}

/// A leader election. Made by [`Session::election`].
///
/// ```
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use fencelock::{MemoryBackend, Session};
///
/// let session = Session::builder(MemoryBackend::new()).start().await?;
/// let election = session.election("orders-primary")?;
/// let leader = election.campaign(b"node-a:8080").await?;
/// let info = election.leader().await?.expect("a leader");
/// assert_eq!(info.value, b"node-a:8080");
/// assert_eq!(info.epoch, leader.epoch());
/// leader.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
pub struct Election {
    session: Session,
    queue: QueueId,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("queue", &self.queue.path())
            .finish()
    }
}

impl Election {
    pub(crate) fn new(session: Session, queue: QueueId) -> Self {
        Election { session, queue }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.queue.name
    }

    /// Joins the candidates and waits until this one leads, publishing `value`.
    ///
    /// Cancel-safe like [`Mutex::lock`](crate::Mutex::lock). Leadership is reported only after
    /// our own entry is confirmed to still exist and the session is still within its local
    /// deadline.
    pub async fn campaign(&self, value: impl AsRef<[u8]>) -> Result<Leadership> {
        let span = tracing::info_span!("campaign", election = %self.queue);
        let held = acquire(&self.session, &self.queue, value.as_ref(), Wait::Forever)
            .instrument(span)
            .await?
            .expect("waiting acquire always grants");
        Ok(Leadership { held })
    }

    /// The current leader, or `None` if there is no candidate.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        let shared = self.session.shared();
        let remote = shared.remote.clone();
        let head = with_retry(shared, || remote.head(&self.queue)).await?;
        Ok(head.map(info))
    }

    /// A stream of leader changes: the current leader first (or `None`), then every change,
    /// including `None` when the last candidate leaves and a new value proclaimed by the same
    /// leader. After an error it re-reads the state and goes on.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<LeaderInfo>>> + Send + 'static {
        let remote = self.session.shared().remote.clone();
        let queue = self.queue.clone();
        // (the head last reported, if any; whether the last read failed)
        let state: (Option<Head>, bool) = (None, false);
        futures::stream::unfold(state, move |(mut seen, failed)| {
            let remote = remote.clone();
            let queue = queue.clone();
            async move {
                if failed {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                loop {
                    if let Some(s) = &seen {
                        if let Err(e) = remote.wait_queue_change(&queue, s.as_ref()).await {
                            return Some((Err(e), (seen, true)));
                        }
                    }
                    match remote.head(&queue).await {
                        Err(e) => return Some((Err(e), (seen, true))),
                        Ok(head) => {
                            let changed = match &seen {
                                None => true,
                                Some(prev) => !same_leader(prev.as_ref(), head.as_ref()),
                            };
                            seen = Some(head.clone());
                            if changed {
                                return Some((Ok(head.map(info)), (seen, false)));
                            }
                        }
                    }
                }
            }
        })
    }
}

/// A queue head as read from the backend (`None`: no candidate).
type Head = Option<(Entry, Vec<u8>)>;

fn same_leader(a: Option<&(Entry, Vec<u8>)>, b: Option<&(Entry, Vec<u8>)>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some((ea, va)), Some((eb, vb))) => ea.token == eb.token && ea.key == eb.key && va == vb,
        _ => false,
    }
}

fn info((entry, value): (Entry, Vec<u8>)) -> LeaderInfo {
    LeaderInfo {
        value,
        epoch: entry.token,
    }
}

/// Proof of leadership, with the epoch. Dropping it resigns in the background.
pub struct Leadership {
    held: Held,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("key", &self.held.entry.key)
            .field("epoch", &self.held.token())
            .field("leader", &self.is_leader())
            .finish()
    }
}

impl Leadership {
    /// The leader's epoch: the fencing token of its entry. Stamp every action with it.
    pub fn epoch(&self) -> FencingToken {
        self.held.token()
    }

    /// The key or node path of our entry on the cluster.
    pub fn key(&self) -> &str {
        &self.held.entry.key
    }

    /// Resolves when leadership is lost (the same contract as
    /// [`Guard::lost`](crate::Guard::lost)). Step down when it fires.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.held.lost()
    }

    /// Whether this candidate still leads as far as this process can tell.
    pub fn is_leader(&self) -> bool {
        self.held.is_held()
    }

    /// Publishes a new value, only while still leader (the write is guarded by our entry's
    /// identity on the cluster). A deposed leader gets [`Error::NotHeld`] or
    /// [`Error::SessionLost`].
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<()> {
        self.held.check_held()?;
        let shared = self.held.session.shared();
        let remote = shared.remote.clone();
        let entry = &self.held.entry;
        let value = value.as_ref();
        if with_retry(shared, || remote.set_value(entry, value)).await? {
            Ok(())
        } else {
            Err(Error::NotHeld("our entry is gone: no longer leader"))
        }
    }

    /// Resigns at once: the next candidate is promoted. A second call fails with
    /// [`Error::NotHeld`].
    pub async fn resign(&self) -> Result<()> {
        self.held.release().await
    }
}
