//! When the sentinels are asked where the primary is: at a grant that an expiry decides (at
//! once, see [`crate::expired`]), at heartbeats (at most every [`CHECK_EVERY`]), and after a
//! request failed the way a failover makes requests fail (in the background, at most every
//! [`RESOLVE_EVERY`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{Primary, CHECK_EVERY, RESOLVE_EVERY};

impl Primary {
    /// Whether the primary is the one the sentinels name (a `redis+sentinel://` URL).
    pub(crate) fn behind_sentinel(&self) -> bool {
        self.sentinels.is_some()
    }

    /// Behind Sentinel, asks the sentinels now, and moves to the primary they name if it is
    /// another one; whether it moved. For a grant the server would make because the sessions
    /// ahead expired: on a primary that `SENTINEL FAILOVER` demoted and the sentinels have not
    /// reconfigured yet, they expire because their owners moved on, and the grant would be
    /// a second holder's (black-box round 22). Sentinels that do not answer change nothing.
    ///
    /// A question that started at `since` or later serves: the entries of a crashed process,
    /// dropped as expired, each make a grant ask (n waiters, a semaphore waiter with n targets,
    /// every grant of the queue for a while, see [`crate::expired`]), and the sentinels are
    /// asked once or twice, not n times.
    pub(crate) async fn moved_now(self: &Arc<Self>, since: Instant) -> bool {
        if self.sentinels.is_none() {
            return false;
        }
        let before = self.generation();
        let mut answered = self.asking.lock().await;
        if answered.is_none_or(|started| started < since) {
            let started = Instant::now();
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(started);
            self.resolve().await;
            *answered = Some(started);
        }
        self.generation() != before
    }

    /// Behind Sentinel, asks the sentinels again (in the background) at most every
    /// [`CHECK_EVERY`]: called at every heartbeat. A primary demoted by `SENTINEL FAILOVER`
    /// goes on accepting writes, which its demotion then drops, until the sentinels
    /// reconfigure it (seconds later): its clients must find the new one by themselves.
    pub(crate) fn check(self: &Arc<Self>) {
        if self.check_due() {
            self.suspect();
        }
    }

    /// Behind Sentinel, whether [`CHECK_EVERY`] has passed since the sentinels were last
    /// asked.
    pub(crate) fn check_due(&self) -> bool {
        self.sentinels.is_some()
            && self
                .last
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_none_or(|t| t.elapsed() >= CHECK_EVERY)
    }

    /// Behind Sentinel, asks the sentinels again (in the background), unless a question is
    /// under way or was asked less than [`RESOLVE_EVERY`] ago: a request met something that a
    /// failover causes (also: fewer replicas than required acknowledged a write).
    pub(crate) fn suspect(self: &Arc<Self>) {
        if self.sentinels.is_none() || self.resolving.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let primary = self.clone();
        tokio::spawn(async move {
            primary.resolve().await;
            // Spaced out: a primary that is down fails every request until the sentinels
            // agree on another.
            tokio::time::sleep(RESOLVE_EVERY).await;
            primary.resolving.store(false, Ordering::SeqCst);
        });
    }
}
