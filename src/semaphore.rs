//! The distributed counting semaphore and its permits.

use std::fmt;
use std::time::Duration;

use crate::acquire::{acquire, check_value, unless_silent, Request, Rule, Wait};
use crate::backend::{EntryInfo, EntryKind, QueueId, QueueKind};
use crate::tenure::{holding_methods, impl_holding, Hold};
use crate::{Error, Mutex, Result, Session};

/// The prefix of the value every permit of fencelock carries: the count its holder believes in.
const PERMITS_TAG: &str = "fencelock-permits=";

impl Session {
    /// A counting semaphore named `name` in this session's namespace with `permits` permits
    /// (at least 1): at most that many holders at once. The name rules are those of
    /// [`mutex`](Self::mutex), limit included: the suffixes of its two queues on the cluster
    /// (`{name}/locks`, `{name}/leases`) do not count against it.
    pub fn semaphore(&self, name: &str, permits: usize) -> Result<Semaphore> {
        if permits == 0 {
            return Err(Error::invalid_config(
                "0 permits",
                "a semaphore needs at least one permit",
            ));
        }
        let locks = self.sub_queue(name, "locks", QueueKind::Lock)?;
        Ok(Semaphore {
            session: self.clone(),
            name: name.to_string(),
            permits,
            gate: Mutex::gate(self.clone(), locks),
            leases: self.sub_queue(name, "leases", QueueKind::Semaphore)?,
        })
    }
}

/// A distributed counting semaphore: at most `n` holders at once, each with a permit of its own
/// and a fencing token. Made by [`Session::semaphore`].
///
/// A permit is an entry (a *lease*) in the semaphore's lease queue. Acquirers line up, FIFO,
/// in a mutex (the *gate*); only the one at the head of the gate creates its lease and, if
/// `n` leases are already there, waits for one of them to go. So a released permit wakes
/// exactly the one acquirer it can serve (and granting it lets the next acquirer through the
/// gate): no thundering herd, whatever the number of waiters.
///
/// On ZooKeeper this is Apache Curator's `InterProcessSemaphoreV2` layout and algorithm
/// (`{name}/locks/_c_{uuid}-lock-{seq}` and `{name}/leases/_c_{uuid}-lease-{seq}`), so Curator
/// and fencelock clients share permits. Participants must agree on `n`: a fencelock acquirer
/// that finds a fencelock permit declaring another count when it reaches the gate's head
/// fails at once with [`Error::InvalidConfig`] (Curator's permits declare none).
///
/// ```
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use fencelock::{MemoryBackend, Session};
///
/// let session = Session::builder(MemoryBackend::new()).start().await?;
/// let pool = session.semaphore("db-connections", 2)?;
/// let p1 = pool.acquire().await?;
/// let p2 = pool.acquire().await?;
/// assert!(pool.try_acquire().await?.is_none());     // both permits taken
/// assert_ne!(p1.token(), p2.token());               // each permit its own token
/// p1.release().await?;
/// let p3 = pool.acquire().await?;
/// # Ok(()) }
/// ```
pub struct Semaphore {
    session: Session,
    name: String,
    permits: usize,
    gate: Mutex,
    leases: QueueId,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .finish()
    }
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The number of permits.
    pub fn permits(&self) -> usize {
        self.permits
    }

    /// Through the gate, then among the leases; a cluster silent past a bounded `wait` ends it
    /// as [`Mutex::lock_timeout`] says (the gate's release and the count check included).
    async fn acquire_permit(&self, wait: Wait) -> Result<Option<Permit>> {
        unless_silent(self.session.shared(), wait, self.permit_through_gate(wait)).await
    }

    async fn permit_through_gate(&self, wait: Wait) -> Result<Option<Permit>> {
        let value = format!("{PERMITS_TAG}{}", self.permits);
        check_value(self.session.shared(), value.as_bytes())?;
        // The semaphore's wait runs from here, through its gate.
        let started = tokio::time::Instant::now();
        // Through the gate first: the one acquirer at its head takes a lease or waits for one.
        let at_gate = match wait {
            Wait::No => self.gate.try_lock().await,
            Wait::Forever => self.gate.lock().await.map(Some),
            Wait::Until { deadline, after } => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                // Timed out at the gate: the caller's timeout, as among the leases (not what
                // was left of it when the gate's wait began).
                self.gate
                    .lock_timeout(left)
                    .await
                    .map(Some)
                    .map_err(|e| match e {
                        Error::Timeout { op, .. } => Error::Timeout { op, after },
                        e => e,
                    })
            }
        };
        // Ended at the gate: the semaphore's outcome (the gate records none of its own).
        if !matches!(at_gate, Ok(Some(_))) {
            self.record(&at_gate, started);
        }
        let Some(gate) = at_gate? else {
            return Ok(None);
        };
        let req = Request {
            queue: &self.leases,
            kind: EntryKind::Shared,
            rule: Rule::Permits(self.permits),
            value: value.as_bytes(),
            recorded: true,
            since: Some((started, gate.waited())),
        };
        // Participants must agree on the count (a refusal is recorded here: the lease's
        // acquisition, which records the others, does not start).
        let tenure = match self.check_count().await {
            Ok(()) => acquire(&self.session, req, None, wait).await,
            Err(e) => {
                let refused = Err(e);
                self.record(&refused, started);
                refused
            }
        };
        // The next acquirer through the gate, whatever the outcome: released and confirmed
        // before this returns, so that a timeout (or `None`) leaves no gate entry behind, as
        // `Mutex::lock_timeout` promises for its own entry. (If this future is dropped here
        // instead, the gate guard's drop hands the release to the background task.)
        let gate_released = gate.release().await;
        // Not acquired with the gate's entry refused removal (permanently): that entry stays and
        // holds every other acquirer at the gate, and "not acquired" promises nothing is left.
        let refused = gate_released.err().filter(Error::leaves_entry);
        let tenure = match (tenure, refused) {
            (Ok(None) | Err(Error::Timeout { .. }), Some(e)) => return Err(e),
            (tenure, _) => tenure,
        };
        let Some(tenure) = tenure? else {
            return Ok(None);
        };
        Ok(Some(Permit {
            hold: Hold::new(tenure),
        }))
    }

    /// Records how an acquisition that ended before its lease's acquisition did ended.
    fn record<T>(&self, res: &Result<Option<T>>, started: tokio::time::Instant) {
        let shared = self.session.shared();
        let name = shared.metrics_names.then_some(self.leases.name.as_str());
        let outcome = crate::metrics::Outcome::of(res, false, started);
        crate::metrics::acquisition("semaphore", name, outcome);
    }

    /// Refuses to take a permit beside one that declares another count. Checked at the head of
    /// the gate, before this acquirer waits among the leases: only the gate's head creates
    /// leases, so none can appear meanwhile. (Checked after the grant, an acquirer that
    /// declared fewer permits than were held waited at the gate's head for every holder to go,
    /// and everyone else waited behind it.)
    async fn check_count(&self) -> Result<()> {
        let shared = self.session.shared();
        let leases = shared.retry(|| shared.remote.inspect(&self.leases)).await?;
        match leases
            .iter()
            .find_map(|l| declared(&l.value).filter(|&n| n != self.permits))
        {
            None => Ok(()),
            Some(other) => Err(Error::invalid_config(
                format!("{} permits", self.permits),
                format!(
                    "participants of semaphore {:?} disagree on the number of permits: another holds a permit of {other}",
                    self.name
                ),
            )),
        }
    }

    /// Waits for a permit.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe like [`Mutex::lock`]: dropping the future leaves no entry behind (neither
    /// in the gate nor among the leases).
    pub async fn acquire(&self) -> Result<Permit> {
        let permit = self.acquire_permit(Wait::Forever).await?;
        Ok(permit.expect("a waiting acquire always grants"))
    }

    /// Takes a permit if one is free right now and no other acquisition is in progress;
    /// `Ok(None)` otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        self.acquire_permit(Wait::No).await
    }

    /// Like [`acquire`](Self::acquire), but gives up after `timeout` with
    /// [`Error::Timeout`], leaving no entry: when it returns the timeout error, its entries (at
    /// the gate and among the leases) have already been removed (confirmed by the cluster;
    /// should the cluster refuse a removal, a permanent error, that error is returned instead).
    /// A cluster that does not answer ends it (and [`try_acquire`](Self::try_acquire)) as
    /// [`Mutex::lock_timeout`] says.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit> {
        let permit = self.acquire_permit(Wait::at_most(timeout)).await?;
        Ok(permit.expect("a waiting acquire always grants"))
    }

    /// The permits held now (the leases, at most `n` of them, in order) and the acquirers
    /// waiting at the gate.
    pub async fn inspect(&self) -> Result<(Vec<EntryInfo>, Vec<EntryInfo>)> {
        let shared = self.session.shared();
        let mut holders = shared
            .retry_read(|| shared.remote.inspect(&self.leases))
            .await?;
        holders.truncate(self.permits);
        let waiters = self.gate.queue_entries().await?;
        Ok((holders, waiters))
    }
}

/// The count a fencelock permit's value declares, if it is one.
fn declared(value: &[u8]) -> Option<usize> {
    std::str::from_utf8(value)
        .ok()?
        .strip_prefix(PERMITS_TAG)?
        .parse()
        .ok()
}

/// One permit of a [`Semaphore`], with its own fencing token.
#[must_use = "the permit is released as soon as it is dropped"]
pub struct Permit {
    hold: Hold,
}

impl Permit {
    holding_methods!("permit");
}

impl_holding!(Permit);

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.key())
            .field("token", &self.token())
            .field("held", &self.is_held())
            .finish()
    }
}
