//! # fencelock
//!
//! Correctness-grade distributed locks and leader election on the etcd or ZooKeeper cluster
//! you already run, with fencing tokens.
//!
//! - **One session per process** ([`Session`]): an etcd lease or a ZooKeeper session, kept
//!   alive by one heartbeat, carries every lock and candidacy. When heartbeats stop for longer
//!   than the TTL the cluster deletes all of them at once.
//! - **An ordered wait queue** ([`Mutex`]): each waiter watches only its predecessor: FIFO,
//!   no thundering herd, no polling.
//! - **A fencing token with every grant** ([`FencingToken`]): etcd create revision or
//!   ZooKeeper `czxid`. The protected resource checks it with a [`Fence`], which is what stops
//!   a holder that was paused past its session's expiry.
//! - **Leader election** ([`Election`]) is the same queue; the token is the epoch.
//! - **A local deadline**: a session that cannot confirm a heartbeat considers itself lost at
//!   `ttl − safety margin` after the last confirmed heartbeat was *sent*, before the cluster can
//!   grant its locks to anyone else.
//!
//! Backends: [`MemoryBackend`] (in-process test double, always compiled), `fencelock-etcd` and
//! `fencelock-zookeeper`. Backend authors implement [`backend::Backend`] and run the
//! conformance suite (the `conformance` module, feature `testing`).
//!
//! ```
//! # #[tokio::main] async fn main() -> fencelock::Result<()> {
//! use std::time::Duration;
//! use fencelock::{Fence, MemoryBackend, Session};
//!
//! let session = Session::builder(MemoryBackend::new())
//!     .ttl(Duration::from_secs(10))
//!     .start()
//!     .await?;
//! let fence = Fence::new(); // lives with the protected resource
//! let guard = session.mutex("jobs/reindex")?.lock().await?;
//! fence.admit(guard.token())?; // every write carries the token
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
pub mod backend;
#[cfg(feature = "testing")]
pub mod conformance;
mod election;
mod error;
mod inspect;
mod memory;
pub mod metrics;
mod multilock;
mod mutex;
mod name;
mod race;
mod retry;
mod rwlock;
mod semaphore;
mod session;
mod supervisor;
mod tenure;
mod token;

pub use acquire::validate_value;
pub use backend::{EntryInfo, EntryKind, QueueKind};
pub use election::{Election, LeaderInfo, Leadership};
pub use error::{BoxError, Error, InvalidInput, Result};
pub use inspect::{QueueInfo, QueueListing};
pub use memory::{MemoryBackend, Request as MemoryRequest};
pub use multilock::{MultiGuard, MultiLock};
pub use mutex::{Guard, Mutex};
pub use name::{
    validate_name, validate_name_in, validate_namespace, MAX_NAME_LEN, RESERVED_LAST_SEGMENTS,
};
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{Permit, Semaphore};
pub use session::{
    IntoBackend, LostReason, Session, SessionBuilder, SessionEnd, SessionState, DEFAULT_NAMESPACE,
    DEFAULT_START_TIMEOUT, DEFAULT_TTL,
};
pub use supervisor::Supervisor;
pub use tenure::Holding;
pub use token::{Fence, FencingToken};

/// Re-exports for the conformance macro, so that it does not depend on the caller's crates.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod __private {
    pub use tokio;
}
