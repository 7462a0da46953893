//! Building a session: its settings, checked, and the opening on the cluster (the session's
//! shared state and its background tasks; `Session` wraps what this returns).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::timeout_at;
use tracing::{info_span, Instrument};

use super::shared::Shared;
use super::{cleanup, clock, heartbeat};
use crate::backend::Backend;
use crate::name::validate_namespace;
use crate::retry::{Backoff, Retry};
use crate::{Error, Result};

/// The default session TTL (10 s).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The default namespace (key prefix) of a session.
pub const DEFAULT_NAMESPACE: &str = "fencelock";
/// How long [`SessionBuilder::start`] keeps trying by default when the cluster is unreachable
/// (10 s).
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`Session`](crate::Session); see [`Session::builder`](crate::Session::builder).
#[derive(Debug)]
#[must_use = "a builder does nothing until `start()` is awaited"]
#[derive(Clone)]
pub struct SessionBuilder {
    backend: Arc<dyn Backend>,
    ttl: Duration,
    margin: Option<Duration>,
    namespace: String,
    start_timeout: Duration,
    metrics_names: bool,
    close_at_deadline: bool,
}

impl SessionBuilder {
    /// Checks `name` as the sessions it starts would ([`Session::mutex`](super::Session::mutex)):
    /// for a caller that must report a bad name before any session starts.
    pub(crate) fn check_name(&self, name: &str) -> Result<()> {
        crate::name::validate_name_in(&self.namespace, name)?;
        self.backend.check_name(&self.namespace, name)
    }

    /// The name of the backend its sessions use.
    pub(crate) fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The defaults on `backend` (see [`Session::builder`](super::Session::builder)).
    pub(super) fn new(backend: Arc<dyn Backend>) -> Self {
        SessionBuilder {
            backend,
            ttl: DEFAULT_TTL,
            margin: None,
            namespace: DEFAULT_NAMESPACE.to_string(),
            start_timeout: DEFAULT_START_TIMEOUT,
            metrics_names: false,
            close_at_deadline: true,
        }
    }

    /// The session TTL: how long the cluster keeps the session without a heartbeat
    /// (default 10 s). Heartbeats go at least every `ttl / 3` (the backend may ask for more:
    /// etcd every `ttl / 6`, ZooKeeper about every `ttl / 5`). Must lie between the backend's minimum
    /// and maximum ([`Error::InvalidTtl`] otherwise).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The safety margin subtracted from the TTL to get the local deadline (default
    /// `max(ttl / 5, 1 s)`, but at most `ttl / 2`). Must be positive (a zero margin leaves no
    /// room for the client's and the cluster's clocks to run at different rates) and at most
    /// half the TTL the cluster grants (a larger one leaves a deadline that comes before the
    /// first heartbeat can be confirmed: a session lost as it starts); [`Error::InvalidTtl`]
    /// otherwise.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// The key prefix under which every lock and election of this session lives
    /// (default `"fencelock"`). An empty namespace gives keys `/{name}/...`, the layout of
    /// etcd's Go `concurrency` package for a prefix `/{name}`. Namespaces nest as prefixes:
    /// the lock `b` of the namespace `ns/a` is the lock `a/b` of `ns`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Whether the acquisition metrics (see [`crate::metrics`]) carry the lock's name as a
    /// `name` label (default off: one series per lock name can be a lot of series).
    pub fn metrics_lock_names(mut self, on: bool) -> Self {
        self.metrics_names = on;
        self
    }

    /// Whether a session lost by its local deadline frees what it holds on the cluster at once
    /// (default `true`: the next waiters are granted without waiting out the TTL).
    ///
    /// With `false` the deadline only declares the session lost (every guard's
    /// [`lost`](crate::Guard::lost) fires, and [`state`](crate::Session::state) says
    /// so): its entries stay until [`Session::close`](crate::Session::close) or the cluster's
    /// expiry, a safety margin or more later. For a holder whose work the fencing token cannot
    /// guard, which must be stopped before anyone else may start (the `fencelock` command
    /// SIGKILLs the command's processes): it stops the work when the session is lost, then
    /// closes the session, so that the next holder is granted only after the work is stopped,
    /// and not a TTL later either. A session lost this way whose last handle is dropped without
    /// a close is closed then.
    pub fn close_at_deadline(mut self, close: bool) -> Self {
        self.close_at_deadline = close;
        self
    }

    /// How long [`start`](Self::start) keeps trying while the cluster answers with temporary
    /// errors (unreachable, electing a leader) before it gives up with the last one (default
    /// [`DEFAULT_START_TIMEOUT`]). Permanent errors (authentication, permissions, bad
    /// settings) are returned at once.
    ///
    /// A try under way is not cut: it ends by the backend's own bounds (its connect and request
    /// timeouts) with the error that says why, so `start` may last up to one such try longer
    /// (`Duration::ZERO`: one try). To bound `start` as a whole, wrap it in
    /// [`tokio::time::timeout`] (the `fencelock` command does: `--connect-timeout`).
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Validates the settings, opens the session on the cluster and starts its background
    /// tasks (see [`start`](SessionBuilder::start)).
    pub(super) async fn open(self) -> Result<Arc<Shared>> {
        let backend = self.backend;
        validate_namespace(&self.namespace)?;
        backend.check_namespace(&self.namespace)?;
        check_ttl(&*backend, self.ttl)?;
        if let Some(m) = self.margin {
            check_margin(m, self.ttl)?;
        }
        let span = info_span!(
            "session",
            backend = backend.name(),
            id = tracing::field::Empty
        );
        let give_up = crate::acquire::deadline_after(self.start_timeout);
        let clock = if backend.runs_on_tokio_clock() {
            clock::Clock::on_tokio_time()
        } else {
            clock::Clock::default()
        };
        // Retried about as often as the session's own loops would: a cluster electing a leader
        // is noticed within a tenth of the TTL (a twentieth, and jitter).
        let (sent, remote) = Retry::new(Backoff::for_ttl(self.ttl))
            .until(give_up)
            .run(
                || {
                    let sent = clock.now();
                    let opened = backend.open_session(self.ttl).instrument(span.clone());
                    async move { opened.await.map(|remote| (sent, remote)) }
                },
                Error::is_temporary,
            )
            .await?;
        span.record("id", remote.id());
        // The granted TTL may differ from the request (etcd raises it to its minimum,
        // ZooKeeper negotiates it): the deadline follows what the cluster enforces.
        let ttl = remote.ttl();
        let margin = self
            .margin
            .unwrap_or_else(|| (ttl / 5).max(Duration::from_secs(1)).min(ttl / 2));
        if let Err(e) = check_margin(margin, ttl) {
            let _ = remote.close().await;
            if ttl == self.ttl {
                return Err(e);
            }
            return Err(Error::invalid_ttl(
                margin,
                format!(
                    "the safety margin must be at most half the ttl, and the cluster granted \
                     {ttl:?} where {:?} was asked (a ZooKeeper server's maxSessionTimeout, say)",
                    self.ttl
                ),
            ));
        }
        let mut deadline = sent.after(ttl - margin);
        // On both clocks: a machine suspended while opening counts as a slow open.
        if clock.passed(sent.after(ttl / 3)) {
            // A slow open: confirm the session now rather than hand out one whose deadline is
            // near (or past).
            // As patient as a heartbeat (a third of the TTL): an answer later than that would
            // hand out a session whose deadline is near all the same.
            let again = clock.now();
            let patience = again.mono + ttl / 3;
            match timeout_at(patience, remote.keep_alive()).await {
                Ok(Ok(())) => deadline = again.after(ttl - margin),
                Ok(Err(e)) => {
                    let _ = remote.close().await;
                    return Err(e);
                }
                Err(_) => {
                    let _ = remote.close().await;
                    return Err(Error::Timeout {
                        op: "first heartbeat",
                        after: ttl / 3,
                    });
                }
            }
        }
        let (cleanup_tx, cleanup_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::new(
            backend,
            remote,
            self.namespace,
            ttl,
            margin,
            clock,
            deadline,
            cleanup_tx,
            span,
            self.metrics_names,
            self.close_at_deadline,
        ));
        tokio::spawn(heartbeat::run(
            Arc::downgrade(&shared),
            shared.stop.clone(),
            shared.remote.clone(),
            heartbeat::Orphaned(Arc::downgrade(&shared)),
        ));
        tokio::spawn(cleanup::worker(shared.clone(), cleanup_rx));
        Ok(shared)
    }
}

fn check_ttl(backend: &dyn Backend, ttl: Duration) -> Result<()> {
    let (min, max) = (backend.min_ttl(), backend.max_ttl());
    // Whatever a backend's minimum says: a session that ends as it begins holds nothing.
    if ttl.is_zero() {
        return Err(Error::invalid_ttl(ttl, "a TTL must be positive"));
    }
    if ttl < min {
        return Err(Error::invalid_ttl(
            ttl,
            format!("below the {} backend's minimum of {min:?}", backend.name()),
        ));
    }
    if ttl > max {
        return Err(Error::invalid_ttl(
            ttl,
            format!("above the {} backend's maximum of {max:?}", backend.name()),
        ));
    }
    Ok(())
}

fn check_margin(margin: Duration, ttl: Duration) -> Result<()> {
    if margin.is_zero() {
        return Err(Error::invalid_ttl(
            margin,
            "the safety margin must be positive: it is the room left for clock drift",
        ));
    }
    // The deadline, `ttl - margin` after a heartbeat's send, must leave room for the next one
    // (a period of at most a third of the TTL) to be confirmed.
    if margin > ttl / 2 {
        return Err(Error::invalid_ttl(
            margin,
            format!(
                "the safety margin must be at most half the ttl ({ttl:?}): a larger one puts \
                 the local deadline before the next heartbeat"
            ),
        ));
    }
    Ok(())
}

/// Anything that can be turned into a shared backend: a backend value or an `Arc` of one.
pub trait IntoBackend {
    /// Converts into `Arc<dyn Backend>`.
    fn into_backend(self) -> Arc<dyn Backend>;
}

impl<B: Backend> IntoBackend for B {
    fn into_backend(self) -> Arc<dyn Backend> {
        Arc::new(self)
    }
}

impl IntoBackend for Arc<dyn Backend> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}
