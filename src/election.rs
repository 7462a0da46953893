//! Leader election: the same ordered queue as the mutex, with a value and a long tenure. The
//! fencing token of the leader's entry is its epoch.

use std::fmt;
use std::sync::Arc;

use futures_core::Stream;
use tracing::Instrument;

use crate::acquire::{acquire_in_turn, check_value, Request, Rule, Wait};
use crate::backend::{Entry, EntryInfo, EntryKind, QueueId, QueueKind};
use crate::retry::Backoff;
use crate::session::Shared;
use crate::tenure::{holding_methods, impl_holding, Hold};
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

impl Session {
    /// An election named `name` in this session's namespace (same name rules as
    /// [`mutex`](Self::mutex)).
    pub fn election(&self, name: &str) -> Result<Election> {
        Ok(Election {
            session: self.clone(),
            queue: self.queue(name, QueueKind::Election)?,
        })
    }
}

impl Election {
    /// The election's name.
    pub fn name(&self) -> &str {
        &self.queue.name
    }

    /// Joins the candidates and waits until this one leads, publishing `value` (at most the
    /// backend's value limit, 1,000,000 bytes by default; [`Error::InvalidValue`] otherwise).
    ///
    /// Leadership is reported only after our own entry is confirmed to still exist and the
    /// session is still within its local deadline.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe like [`Mutex::lock`](crate::Mutex::lock): dropping the future leaves no
    /// entry behind.
    pub async fn campaign(&self, value: impl AsRef<[u8]> + Send) -> Result<Leadership> {
        let leadership = self
            .campaign_with(value.as_ref().to_vec(), Wait::Forever)
            .await?;
        Ok(leadership.expect("a waiting campaign always leads"))
    }

    /// Leads at once if there is no other candidate; `Ok(None)` (and no entry left behind)
    /// otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Self::campaign).
    pub async fn try_campaign(&self, value: impl AsRef<[u8]> + Send) -> Result<Option<Leadership>> {
        self.campaign_with(value.as_ref().to_vec(), Wait::No).await
    }

    /// Like [`campaign`](Self::campaign), but gives up after `timeout` with
    /// [`Error::Timeout`], leaving no entry.
    /// A cluster that does not answer ends it as [`Mutex::lock_timeout`](crate::Mutex::lock_timeout)
    /// says.
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Self::campaign).
    pub async fn campaign_timeout(
        &self,
        value: impl AsRef<[u8]> + Send,
        timeout: std::time::Duration,
    ) -> Result<Leadership> {
        let leadership = self
            .campaign_with(value.as_ref().to_vec(), Wait::at_most(timeout))
            .await?;
        Ok(leadership.expect("a waiting campaign always leads"))
    }

    async fn campaign_with(&self, value: Vec<u8>, wait: Wait) -> Result<Option<Leadership>> {
        let span = tracing::info_span!("campaign", election = %self.queue);
        async {
            let value = value.as_slice();
            let shared = self.session.shared();
            check_value(shared, value)?;
            let req = Request {
                queue: &self.queue,
                kind: EntryKind::Exclusive,
                rule: Rule::Exclusive,
                value,
                recorded: true,
                since: None,
            };
            let tenure = acquire_in_turn(&self.session, req, false, wait).await?;
            Ok(tenure.map(|tenure| Leadership {
                hold: Hold::new(tenure),
            }))
        }
        .instrument(span)
        .await
    }

    /// Every candidate, the leader first, in queue order: key, epoch (token), session, value.
    pub async fn candidates(&self) -> Result<Vec<EntryInfo>> {
        let shared = self.session.shared();
        shared
            .retry_read(|| shared.remote.inspect(&self.queue))
            .await
    }

    /// The current leader, or `None` if there is no candidate.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        let shared = self.session.shared();
        let remote = shared.remote.clone();
        let head = shared.retry_read(|| remote.head(&self.queue)).await?;
        Ok(head.map(info))
    }

    /// A stream of leader changes: the current leader first (or `None`), then every change,
    /// including `None` when the last candidate leaves and a new value proclaimed by the same
    /// leader. After a temporary error it yields the error, re-reads the state (after a
    /// pause) and goes on. Once the session is lost or closed it yields one
    /// [`Error::SessionLost`] and ends; after a permanent error (say
    /// [`Error::PermissionDenied`]: retrying cannot help) it yields that error and ends.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<LeaderInfo>>> + Send + 'static {
        let shared = self.session.shared().clone();
        let queue = self.queue.clone();
        let state = Observer {
            seen: None,
            backoff: None,
            done: false,
        };
        futures_util::stream::unfold(state, move |mut st| {
            let shared = shared.clone();
            let queue = queue.clone();
            async move {
                if st.done {
                    return None;
                }
                let item = st.next(&shared, &queue).await;
                if item.as_ref().is_err_and(|e| !e.is_temporary()) {
                    st.done = true;
                }
                Some((item, st))
            }
        })
    }
}

/// A queue head as read from the backend (`None`: no candidate).
type Head = Option<(Entry, Vec<u8>)>;

/// The state of an [`Election::observe`] stream.
struct Observer {
    /// The head last reported, if any.
    seen: Option<Head>,
    /// Set after an error: the pause before the next read.
    backoff: Option<Backoff>,
    done: bool,
}

impl Observer {
    async fn next(&mut self, shared: &Arc<Shared>, queue: &QueueId) -> Result<Option<LeaderInfo>> {
        let remote = shared.remote.clone();
        // The caller asks again after an error: pause first (this is not a retry loop, the
        // caller decides whether to go on).
        if let Some(backoff) = self.backoff.as_mut() {
            shared.unless_lost(backoff.pause()).await?;
        }
        loop {
            shared.check_alive()?;
            if let Some(seen) = &self.seen {
                let change = remote.wait_queue_change(queue, seen.as_ref());
                if let Err(e) = shared.unless_lost(change).await? {
                    return Err(self.failed(shared, e));
                }
            }
            match shared.unless_lost(remote.head(queue)).await? {
                Err(e) => return Err(self.failed(shared, e)),
                Ok(head) => {
                    self.backoff = None;
                    let changed = match &self.seen {
                        None => true,
                        Some(prev) => !same_leader(prev.as_ref(), head.as_ref()),
                    };
                    self.seen = Some(head.clone());
                    if changed {
                        return Ok(head.map(info));
                    }
                }
            }
        }
    }

    fn failed(&mut self, shared: &Shared, e: Error) -> Error {
        self.backoff.get_or_insert_with(|| shared.backoff());
        shared.note(&e);
        e
    }
}

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
#[must_use = "leadership is resigned as soon as it is dropped"]
pub struct Leadership {
    hold: Hold,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("key", &self.key())
            .field("epoch", &self.epoch())
            .field("leader", &self.is_leader())
            .finish()
    }
}

impl Leadership {
    holding_methods!("leadership");

    /// The leader's epoch: the fencing token of its entry. Stamp every action with it.
    pub fn epoch(&self) -> FencingToken {
        self.token()
    }

    /// Whether this candidate still leads as far as this process can tell.
    pub fn is_leader(&self) -> bool {
        self.is_held()
    }

    /// Publishes a new value, only while still leader (the write is guarded by our entry's
    /// identity on the cluster). A deposed leader gets [`Error::NotHeld`] with the reason.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the leadership as it was; the new value may or may not have
    /// been published (the write is one request to the cluster, and a dropped future does not
    /// know whether it arrived). Proclaim again to be sure of the value.
    pub async fn proclaim(&self, value: impl AsRef<[u8]> + Send) -> Result<()> {
        let value = value.as_ref().to_vec();
        let value = value.as_slice();
        let tenure = self.hold.tenure();
        let shared = tenure.session.shared();
        check_value(shared, value)?;
        self.hold.check_held()?;
        let remote = shared.remote.clone();
        let entry = &tenure.entry;
        match shared.retry(|| remote.set_value(entry, value)).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::NotHeld(tenure.found_deleted())),
            Err(Error::SessionLost(end)) => Err(Error::NotHeld(LostReason::Session(end))),
            Err(e) => Err(e),
        }
    }

    /// Resigns at once: the next candidate is promoted. A second call fails with
    /// [`Error::NotHeld`].
    ///
    /// # Cancel safety
    ///
    /// As `release`: dropping the future resigns all the same (the entry is removed by the
    /// session's background task once the leadership is dropped).
    pub async fn resign(&self) -> Result<()> {
        self.release().await
    }
}

impl_holding!(Leadership);
