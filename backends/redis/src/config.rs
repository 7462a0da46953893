//! Settings of the Redis backend, and their validation.

use std::time::Duration;

use fencelock::{Error, Result};

use crate::RedisBackend;

/// How long a connect, and every request, waits for the server by default (5 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest connect or request timeout accepted (one hour): longer values are refused, not
/// clamped.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most replicas [`RedisConfig::wait_for_replicas`] accepts.
pub const MAX_REPLICAS: usize = 1000;

/// Settings of a [`RedisBackend`].
///
/// ```no_run
/// # async fn f() -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock_redis::RedisConfig;
///
/// let backend = RedisConfig::new("redis://app:s3cret@10.0.0.5:6379/0")
///     .timeout(Duration::from_secs(2))
///     .wait_for_replicas(1, Duration::from_millis(500))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) url: String,
    pub(crate) timeout: Duration,
    pub(crate) replicas: Option<(usize, Duration)>,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        let url = match self.url.rsplit_once('@') {
            Some((_, host)) => format!("redis://***@{host}"),
            None => self.url.clone(),
        };
        f.debug_struct("RedisConfig")
            .field("url", &url)
            .field("timeout", &self.timeout)
            .field("replicas", &self.replicas)
            .finish()
    }
}

impl RedisConfig {
    /// Settings for the Redis server at `url`: `redis://[user[:password]@]host[:port][/db]`
    /// (`rediss://` is not supported: this build has no TLS for Redis), or a bare
    /// `host:port`.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            timeout: DEFAULT_TIMEOUT,
            replicas: None,
        }
    }

    /// How long a connect and each request wait for the server (default [`DEFAULT_TIMEOUT`];
    /// at most [`MAX_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// After creating an entry (or a session), waits until `replicas` replicas acknowledged it
    /// (Redis `WAIT`, at most `timeout`, which must be shorter than [`timeout`](Self::timeout)
    /// and, since heartbeats wait too, under a third of each session's TTL),
    /// and fails the acquisition with a temporary error (retried) if fewer did. With it, a
    /// replica promoted after the primary's crash has every entry and token counter a holder
    /// was granted on: the grant and the fencing token survive a failover to an acknowledging
    /// replica. Heartbeats are acknowledged the same way (a heartbeat that fewer replicas
    /// acknowledged counts as failed: the session is suspended, and lost at its local deadline
    /// if it stays so), so that a promoted replica never expires a session before that
    /// session's own deadline. The price: with fewer replicas than `replicas` answering, no
    /// lock is granted and held locks are lost at the deadline. Creates and heartbeats each go
    /// through a connection of their own (`WAIT` blocks the connection it runs on). Releases
    /// are not waited for. Off by default (at most [`MAX_REPLICAS`]).
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// Checks the settings: a URL the client parses, timeouts within bounds.
    pub(crate) fn validate(&self) -> Result<redis::Client> {
        check_timeout("timeout", self.timeout)?;
        if let Some((n, t)) = self.replicas {
            if n == 0 || n > MAX_REPLICAS {
                return Err(Error::invalid_config(
                    n.to_string(),
                    format!("replicas must be between 1 and {MAX_REPLICAS}"),
                ));
            }
            check_timeout("replica timeout", t)?;
            if t >= self.timeout {
                return Err(Error::invalid_config(
                    format!("{t:?}"),
                    "the replicas' timeout must be shorter than the request timeout",
                ));
            }
        }
        let url = if self.url.contains("://") {
            self.url.clone()
        } else {
            format!("redis://{}", self.url)
        };
        if url.starts_with("rediss://") {
            return Err(Error::invalid_config(
                "rediss://",
                "TLS is not supported by the Redis backend in this version",
            ));
        }
        redis::Client::open(url.as_str())
            .map_err(|e| Error::invalid_config(redact(&self.url), e.to_string()))
    }

    /// Connects (see [`RedisBackend::connect_with`]).
    pub async fn connect(self) -> Result<RedisBackend> {
        RedisBackend::connect_with(self).await
    }
}

fn check_timeout(what: &str, t: Duration) -> Result<()> {
    if t.is_zero() || t > MAX_TIMEOUT {
        return Err(Error::invalid_config(
            format!("{what} {t:?}"),
            "must be more than zero and at most one hour",
        ));
    }
    Ok(())
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match url.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => url.to_string(),
    }
}
