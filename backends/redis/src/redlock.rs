//! Redlock: a lock on a majority of N independent Redis servers, with a fencing token.

use std::sync::Arc;
use std::time::Duration;

use fencelock::backend::{Backoff, Deadline, Retry};
use fencelock::{Error, FencingToken, Result};
use futures_util::future::join_all;
use redis::aio::ConnectionManager;
use redis::Script;
use tokio::time::Instant;

use crate::error::{map, NAME};
use crate::layout::KEY_PREFIX;
use crate::redlock_timing::{RedlockTiming, MAX_LOCK_TTL, MIN_LOCK_TTL};
use crate::scripts::redlock::{ACQUIRE, FENCE, RELEASE};

mod connect;
mod guard;

pub use guard::RedlockGuard;

/// Redlock over N independent Redis servers (no replication between them), as the Redis
/// documentation describes it: a lock is granted when a majority of servers set its key
/// (`SET NX PX`) within the TTL, and it is valid for `TTL − elapsed − drift`.
///
/// ```no_run
/// # async fn f() -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock_redis::Redlock;
///
/// let redlock = Redlock::connect(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
/// if let Some(guard) = redlock.try_lock("reports/daily", Duration::from_secs(10)).await? {
///     // Pass guard.token() to the resource, and stop before guard.valid_for() runs out.
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
///
/// # The fencing token, and what it relies on
///
/// Each server keeps a counter per lock name. An acquisition reads the counters of the
/// majority that granted it, takes their maximum plus one as its token, and raises the
/// counters of a majority to it before it returns. Any two majorities share a server, so an
/// acquisition that starts after another one returned reads a counter at least as large as
/// the other's token: **tokens increase across acquisitions that do not overlap in time**,
/// even when Redlock's exclusion fails (a holder paused past its validity, a clock that
/// jumped) — which is when a resource needs them.
///
/// This relies on no server losing an acknowledged write: a server that restarts without its
/// data (no persistence, or `appendfsync` other than `always`) can lower a counter, and then
/// a later token can repeat an earlier one. It does not rely on clocks. The counters
/// (`fencelock:redlock-token:{name}`, one small key per lock name on each server) never expire.
///
/// # What Redlock's exclusion relies on
///
/// Bounded clock drift between the servers and the client, and no process pause longer than
/// the validity left: a client paused past its validity still believes it holds the lock while
/// another is granted it. Check [`RedlockGuard::valid_for`] before each protected action, and
/// give the resource the token.
#[derive(Clone)]
pub struct Redlock {
    servers: Arc<Vec<ConnectionManager>>,
    timing: RedlockTiming,
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field("servers", &self.servers.len())
            .field("timing", &self.timing)
            .finish()
    }
}

/// An acquisition in progress: dropped before it settled (its future cancelled), it releases
/// whatever keys it may have set, in a task of its own.
struct Attempt<'a> {
    redlock: &'a Redlock,
    name: &'a str,
    value: &'a str,
    settled: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (redlock, name, value) = (
                self.redlock.clone(),
                self.name.to_string(),
                self.value.to_string(),
            );
            rt.spawn(async move {
                redlock.release_all(&name, &value).await;
            });
        }
    }
}

impl Redlock {
    fn majority(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    fn keys(name: &str) -> (String, String) {
        (
            format!("{KEY_PREFIX}:redlock:{name}"),
            format!("{KEY_PREFIX}:redlock-token:{name}"),
        )
    }

    /// Runs `script` on every server at once, each bounded by the request timeout: each
    /// server's answer, or its error (temporary when it did not answer in time).
    async fn on_all(&self, script: &Script, keys: &[&str], args: &[String]) -> Vec<Result<i64>> {
        let timeout = self.timing.request_timeout;
        join_all(self.servers.iter().map(|con| {
            let mut con = con.clone();
            let mut inv = script.prepare_invoke();
            for k in keys {
                inv.key(*k);
            }
            for a in args {
                inv.arg(a);
            }
            async move {
                match tokio::time::timeout(timeout, inv.invoke_async::<i64>(&mut con)).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(map("redlock", e)),
                    Err(_) => Err(crate::error::temporary("redlock", "no answer in time")),
                }
            }
        }))
        .await
    }

    /// The error when fewer than a majority answered `answers`: permanent (the first
    /// permanent error, say a wrong password or a missing permission) when the servers that
    /// failed permanently leave too few to ever make a majority, else temporary.
    fn no_majority(&self, answers: Vec<Result<i64>>) -> Error {
        let mut permanent: Vec<Error> = answers
            .into_iter()
            .filter_map(Result::err)
            .filter(|e| !e.is_temporary())
            .collect();
        if self.servers.len() - permanent.len() < self.majority() && !permanent.is_empty() {
            return permanent.swap_remove(0);
        }
        Error::backend(
            NAME,
            "redlock",
            true,
            "fewer than a majority of the Redis servers answered",
        )
    }

    /// Deletes the lock on every server where it is still ours: each server's answer (1 if
    /// it deleted it).
    async fn release_all(&self, name: &str, value: &str) -> Vec<Result<i64>> {
        let (key, _) = Self::keys(name);
        self.on_all(&RELEASE, &[&key], &[value.to_string()]).await
    }

    /// One attempt: the lock on a majority within its validity, or `None` if a majority
    /// answered but the lock is taken (having released whatever it set). Fewer than a majority
    /// answering is a temporary [`Error::Backend`] — permanent when enough servers refuse for
    /// good (a wrong password, a missing permission: [`Error::is_temporary`] is `false`) that
    /// no majority can ever answer; a majority that granted it too late to be of use (its
    /// validity ran out during the requests: slow servers) is a temporary error too. A `ttl`
    /// whose validity (less the drift allowance) would not exceed two request timeouts (a grant
    /// takes two rounds: the lock, then its fencing token) is [`Error::InvalidTtl`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an attempt dropped half way releases, in a task of its own, whatever keys
    /// it may have set (the release follows its requests on each server's connection). Dropped
    /// outside a Tokio runtime, it leaves them to expire after `ttl`: the lock is then
    /// unavailable for at most `ttl`; exclusion is not affected.
    pub async fn try_lock(&self, name: &str, ttl: Duration) -> Result<Option<RedlockGuard>> {
        fencelock::validate_name(name)?;
        if !(MIN_LOCK_TTL..=MAX_LOCK_TTL).contains(&ttl) {
            return Err(Error::invalid_ttl(ttl, "must be between 10 ms and one day"));
        }
        let drift = ttl.mul_f64(self.timing.drift_factor) + Duration::from_millis(2);
        let validity = ttl.saturating_sub(drift);
        if validity <= self.timing.request_timeout * 2 {
            // A grant takes two rounds (the lock, then its token), each up to a request
            // timeout: a validity shorter than both could run out on every try with one slow
            // server. Refused as a setting rather than failing for ever.
            return Err(Error::invalid_ttl(
                ttl,
                format!(
                    "less the drift allowance ({drift:?}), it must exceed twice the request timeout ({:?}): a grant takes two rounds",
                    self.timing.request_timeout
                ),
            ));
        }
        let value = uuid::Uuid::new_v4().simple().to_string();
        let mut attempt = Attempt {
            redlock: self,
            name,
            value: &value,
            settled: false,
        };
        let (key, counter) = Self::keys(name);
        // On the clock that counts through suspend too: a machine that sleeps past the TTL
        // wakes with the lock expired on the servers (their clocks ran on).
        let valid_until = Deadline::after(validity);
        let ttl_ms = ttl.as_millis().to_string();
        let got = self
            .on_all(&ACQUIRE, &[&key, &counter], &[value.clone(), ttl_ms])
            .await;
        let granted: Vec<i64> = got
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .copied()
            .filter(|c| *c >= 0)
            .collect();
        let mut unavailable = None;
        // A majority granted it, but too late to be of use: the servers are slow, the lock
        // is not taken.
        let too_late = || {
            Error::backend(
                NAME,
                "redlock",
                true,
                "a majority granted the lock after its validity ran out (slow servers)",
            )
        };
        if granted.len() >= self.majority() && valid_until.passed() {
            unavailable = Some(too_late());
        } else if granted.len() >= self.majority() {
            // The token: above every counter of this majority, then raised on a majority.
            let token = granted.iter().max().copied().unwrap_or(0).saturating_add(1);
            let fenced = self
                .on_all(
                    &FENCE,
                    &[&key, &counter],
                    &[value.clone(), token.to_string()],
                )
                .await;
            if fenced.iter().filter(|r| matches!(r, Ok(1))).count() >= self.majority()
                && !valid_until.passed()
            {
                attempt.settled = true;
                return Ok(Some(RedlockGuard {
                    redlock: self.clone(),
                    name: name.to_string(),
                    value: value.clone(),
                    token: FencingToken::new(token as u64),
                    valid_until,
                }));
            }
            // The counters could not be raised on a majority: unavailable, not taken.
            if fenced.iter().filter(|r| r.is_ok()).count() < self.majority() {
                unavailable = Some(self.no_majority(fenced));
            } else if valid_until.passed() {
                unavailable = Some(too_late());
            }
        }
        self.release_all(name, &value).await;
        attempt.settled = true;
        // Fewer than a majority answered: the lock may well be free; unavailable, not taken.
        if got.iter().filter(|r| r.is_ok()).count() < self.majority() {
            return Err(self.no_majority(got));
        }
        match unavailable {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Retries [`try_lock`](Self::try_lock) with exponential backoff and jitter until it
    /// succeeds or `timeout` passes ([`Error::Timeout`]; `Duration::MAX` waits for ever).
    /// Temporary errors (no majority answered) are retried too; a permanent one (bad input,
    /// or servers refusing us for good: a wrong password, a missing permission) is returned at
    /// once.
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock`](Self::try_lock): a dropped call leaves no key behind.
    pub async fn lock_timeout(
        &self,
        name: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<RedlockGuard> {
        let deadline = Instant::now().checked_add(timeout);
        let backoff = Backoff::between(
            self.timing.retry_delay,
            self.timing.retry_delay.max(Duration::from_secs(1)),
        );
        let tried = Retry::new(backoff)
            .until(deadline)
            .run(
                || async {
                    // Not obtained (a majority holds it for another) is a failed try, and a
                    // temporary one like every timeout.
                    self.try_lock(name, ttl).await?.ok_or(Error::Timeout {
                        op: "redlock",
                        after: timeout,
                    })
                },
                Error::is_temporary,
            )
            .await;
        tried.map_err(|e| {
            if e.is_temporary() {
                // Out of time while the servers were still unreachable.
                Error::Timeout {
                    op: "redlock",
                    after: timeout,
                }
            } else {
                e
            }
        })
    }
}
