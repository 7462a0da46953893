//! The conformance suite: one documented `pub async fn` per behaviour, run against every
//! backend (memory, etcd, ZooKeeper) by [`conformance_tests!`](crate::conformance_tests).
//!
//! **Unstable**: compiled only with the `testing` feature, for backend authors and fencelock's
//! own tests. Behaviours are added, changed and removed without a major version bump; it is not
//! part of the stable public API.
//!
//! Each behaviour takes a [`Factory`] that hands out fresh sessions, works in a namespace of its
//! own, asserts (panics) on any violation and bounds every wait, so that a bug fails instead of
//! hanging. Backend authors run it with:
//!
//! ```ignore
//! fencelock::conformance_tests!(async { Some(MyFactory::connect().await) });
//! ```
//!
//! where the expression is a future of `Option<impl Factory>` (`None` skips the tests, for a
//! server that is not installed outside CI).

mod contract;
mod election;
mod input;
mod inspect;
mod multilock;
mod mutex;
mod names;
mod rwlock;
mod semaphore;
mod session;
mod supervisor;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::Backend;
use crate::{MemoryBackend, Result, Session};

pub use contract::*;
pub use election::*;
pub use input::*;
pub use inspect::*;
pub use multilock::*;
pub use mutex::*;
pub use names::*;
pub use rwlock::*;
pub use semaphore::*;
pub use session::*;
pub use supervisor::*;

/// Hands out what the suite needs from one backend.
#[async_trait]
pub trait Factory: Send + Sync + 'static {
    /// The backend under test; each call to [`Session::builder`] on it must give an
    /// independent session.
    fn backend(&self) -> Arc<dyn Backend>;

    /// A short TTL the backend accepts, for expiry tests (the backend's minimum, say).
    fn short_ttl(&self) -> Duration;

    /// Deletes the entry at `key` as an outsider (an operator) would, bypassing fencelock.
    async fn delete_as_admin(&self, key: &str) -> Result<()>;

    /// Writes under `namespace`, bypassing fencelock, keys (nodes) that another tool could
    /// leave there and that no fencelock name maps to: an empty segment (etcd:
    /// `etcdctl lock {namespace}/jobs/` makes `{namespace}/jobs//{lease}`), a name the rules
    /// refuse, whatever the backend's layout cannot read as a queue. Where the backend ties
    /// records to sessions they are tied to `session` (an id as [`Session::id`] gives, alive
    /// while the caller runs). Returns how many of them a listing of the namespace counts as
    /// skipped ([`QueueListing::skipped`](crate::QueueListing::skipped)).
    async fn write_foreign_keys(&self, namespace: &str, session: &str) -> Result<usize>;
}

/// The memory backend's [`Factory`].
#[derive(Debug, Clone, Default)]
pub struct MemoryFactory {
    backend: MemoryBackend,
}

impl MemoryFactory {
    /// A factory over a fresh in-memory cluster.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Factory for MemoryFactory {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_millis(1500)
    }

    async fn delete_as_admin(&self, key: &str) -> Result<()> {
        self.backend.delete_key(key);
        Ok(())
    }

    async fn write_foreign_keys(&self, namespace: &str, session: &str) -> Result<usize> {
        let keys = [
            format!("{namespace}/jobs//{session}"),
            format!("{namespace}/loose"),
            format!("{namespace}/bad\u{7}name/{session}"),
        ];
        for key in &keys {
            assert!(self.backend.put_foreign_key(key, session), "{key}");
        }
        Ok(keys.len())
    }
}

/// Generates one `#[tokio::test]` per behaviour of the suite. The argument is a future of
/// `Option<impl Factory>`; `None` skips (print why: a missing server outside CI).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@each $factory;
            acquire_release,
            try_lock_contended,
            fifo_five_waiters,
            tokens_increase,
            contended_counter,
            local_queue_one_remote_entry,
            cancelled_lock_leaves_no_entry,
            lock_timeout_leaves_no_entry,
            every_timeout_leaves_no_entry,
            stale_holder_is_fenced,
            release_twice,
            dropped_guard_releases,
            close_frees_everything,
            entry_deleted_fires_lost,
            requeue_after_entry_deleted,
            a_suspend_past_the_deadline_loses_every_lock,
            dropped_loss_watches_leave_no_task,
            waiter_fails_when_session_lost,
            session_states,
            bad_input,
            every_primitive_takes_every_valid_name,
            use_after_close,
            use_after_lost,
            single_leader_among_five,
            resign_promotes_in_fifo_order,
            observe_reports_every_change,
            deposed_leader_cannot_proclaim,
            leader_steps_down_before_successor,
            cancelled_campaign_leaves_no_entry,
            candidates_in_one_session,
            mutex_and_election_of_one_name,
            one_name_several_primitives,
            lock_timeout_zero_behaves_as_try_lock,
            a_waiter_learns_its_entry_was_deleted,
            huge_durations_never_panic,
            oversized_values_are_refused,
            largest_values_of_many_candidates,
            odd_unicode_names,
            observe_ends_when_session_ends,
            supervisor_keeps_leading,
            supervisor_ends_when_the_work_releases,
            supervisor_campaigns_again_when_its_entry_is_deleted,
            supervisor_deposes_a_term_held_through_a_reentered_guard,
            supervisor_spaces_quick_losses,
            supervisor_refuses_a_grant_dropped_by_its_closure,
            state_changes_until_closed,
            readers_share_writer_excludes,
            queued_writer_holds_back_later_readers,
            rwlock_in_one_session,
            rwlock_cancel_and_inspect,
            semaphore_bounds_holders,
            semaphore_waits_and_hands_over,
            semaphore_disagreement_is_an_error,
            cancelled_acquire_leaves_no_permit,
            dropped_permit_releases,
            multi_lock_takes_all,
            multi_try_lock_is_all_or_nothing,
            multi_locks_never_deadlock,
            multi_lock_at_the_backend_limit,
            inspection_shows_holder_and_waiters,
            revocation_request_reaches_the_holder,
            reentrant_guard_keeps_token,
            queues_list_the_namespace,
            foreign_keys_do_not_break_listings,
            contract_enqueue_is_idempotent_per_attempt,
            contract_abandon_removes_only_the_attempt,
            contract_ahead_lists_the_queue_in_order,
            contract_still_ahead_reads_the_nearest,
            contract_wait_never_misses_a_racing_deletion,
            contract_guarded_remove_never_deletes_a_newer_entry,
            contract_enqueue_all_is_all_or_nothing,
            contract_session_ends_without_keep_alive,
            contract_own_entry_deletion_is_seen,
        );
    };
    (@each $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::runtime().block_on(async {
                    let Some(factory) = $factory.await else { return };
                    $crate::conformance::$name(&factory).await;
                });
            }
        )*
    };
}

/// The runtime each generated test runs on: multi-threaded, two workers, time and I/O
/// enabled (what `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` builds).
pub fn runtime() -> crate::__private::tokio::runtime::Runtime {
    crate::__private::tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A namespace no other test uses.
pub fn unique_namespace(test: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("conformance/{test}-{}", &id[..12])
}

/// The bound on any single wait in the suite.
pub const WAIT: Duration = Duration::from_secs(30);

/// Awaits `fut`, panicking with `what` if it takes longer than `limit`.
pub async fn bounded<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Opens a session of `factory` in `namespace`.
pub async fn open(factory: &dyn Factory, namespace: &str, ttl: Duration) -> Session {
    bounded(
        WAIT,
        "open a session",
        Session::builder(factory.backend())
            .namespace(namespace)
            .ttl(ttl)
            .start(),
    )
    .await
    .expect("open a session")
}

/// Polls the server's listing of `session`'s namespace until `pred` holds (a state on the
/// server that no event announces), failing after [`WAIT`].
pub async fn wait_entries(
    session: &Session,
    what: &str,
    pred: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let start = Instant::now();
    loop {
        let list = session.list_entries().await.expect("list entries");
        if pred(&list) {
            return list;
        }
        if start.elapsed() > WAIT {
            panic!("timed out waiting for {what}; entries: {list:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The TTL used by tests that do not exercise expiry.
pub const TTL: Duration = Duration::from_secs(10);
