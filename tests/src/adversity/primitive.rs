//! Which primitive a workload exercises (a mutex, a read-write lock, a semaphore), and its
//! grants behind one face.

use std::future::Future;
use std::time::Duration;

use fencelock::{Guard, LostReason, Permit, ReadGuard, Result, Session, WriteGuard};

use super::history::Limit;

/// The primitive under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    /// `Mutex::lock_timeout`.
    Mutex,
    /// `RwLock`: two reads for every write (child processes only write).
    ReadWrite,
    /// `Semaphore` with this many permits.
    Semaphore(usize),
}

impl Primitive {
    /// The name on command lines and in summaries: `mutex`, `read-write`, `semaphore:N`.
    pub fn arg(self) -> String {
        match self {
            Primitive::Mutex => "mutex".into(),
            Primitive::ReadWrite => "read-write".into(),
            Primitive::Semaphore(n) => format!("semaphore:{n}"),
        }
    }

    /// The primitive named `arg` (see [`arg`](Self::arg)).
    pub fn parse(arg: &str) -> Option<Primitive> {
        match arg {
            "mutex" => Some(Primitive::Mutex),
            "read-write" => Some(Primitive::ReadWrite),
            _ => arg
                .strip_prefix("semaphore:")?
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .map(Primitive::Semaphore),
        }
    }

    /// How many of its tenures may overlap.
    pub fn limit(self) -> Limit {
        match self {
            Primitive::Mutex => Limit::One,
            Primitive::ReadWrite => Limit::ReadersOrOneWriter,
            Primitive::Semaphore(n) => Limit::Permits(n),
        }
    }

    /// Whether its holders write to the fenced resource (a semaphore's permits are not
    /// ordered: one fence cannot tell a stale permit from a concurrent one).
    pub fn fenced(self) -> bool {
        !matches!(self, Primitive::Semaphore(_))
    }

    /// Acquires turn `turn` of a worker, bounded by `timeout`: on a read-write lock every third
    /// turn writes (`always_write` for child processes, whose pauses test the fence).
    pub async fn acquire(
        self,
        s: &Session,
        name: &str,
        turn: u64,
        always_write: bool,
        timeout: Duration,
    ) -> Result<Grant> {
        Ok(match self {
            Primitive::Mutex => Grant::Lock(s.mutex(name)?.lock_timeout(timeout).await?),
            Primitive::ReadWrite if always_write || turn.is_multiple_of(3) => {
                Grant::Write(s.rwlock(name)?.write_timeout(timeout).await?)
            }
            Primitive::ReadWrite => Grant::Read(s.rwlock(name)?.read_timeout(timeout).await?),
            Primitive::Semaphore(n) => {
                Grant::Permit(s.semaphore(name, n)?.acquire_timeout(timeout).await?)
            }
        })
    }
}

/// A grant of any primitive.
#[derive(Debug)]
pub enum Grant {
    /// A mutex guard.
    Lock(Guard),
    /// A read guard.
    Read(ReadGuard),
    /// A write guard.
    Write(WriteGuard),
    /// A permit.
    Permit(Permit),
}

macro_rules! each {
    ($g:expr, $x:ident => $e:expr) => {
        match $g {
            Grant::Lock($x) => $e,
            Grant::Read($x) => $e,
            Grant::Write($x) => $e,
            Grant::Permit($x) => $e,
        }
    };
}

impl Grant {
    /// Its token.
    pub fn token(&self) -> u64 {
        each!(self, g => g.token().get())
    }

    /// Whether it is shared (a reader, a permit).
    pub fn shared(&self) -> bool {
        matches!(self, Grant::Read(_) | Grant::Permit(_))
    }

    /// Whether it still holds, locally.
    pub fn is_held(&self) -> bool {
        each!(self, g => g.is_held())
    }

    /// Resolves when it is lost.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let lost: std::pin::Pin<Box<dyn Future<Output = LostReason> + Send>> =
            each!(self, g => Box::pin(g.lost()));
        lost
    }

    /// Releases it.
    pub async fn release(&self) -> Result<()> {
        each!(self, g => g.release().await)
    }
}
