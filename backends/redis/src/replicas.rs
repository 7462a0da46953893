//! Creates acknowledged by replicas (`RedisConfig::wait_for_replicas`): the script and a `WAIT`
//! on one connection of their own. `WAIT` counts the writes of the connection it runs on, and
//! blocks that connection until the replicas answer, so it must neither share the sessions'
//! connection (heartbeats would wait behind it) nor follow a script sent on another one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock::Result;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::sync::Mutex as AsyncMutex;

use crate::error::temporary;
use crate::layout::Group;
use crate::primary::Primary;
use crate::reply::Args;
use crate::scripts::Op;

/// What a session of a backend with `wait_for_replicas` runs acknowledged, each on a
/// connection of its own: creates, and heartbeats (so that a heartbeat never waits behind a
/// create's `WAIT`). One per session: a heartbeat never waits behind another session's.
pub(crate) struct Acks {
    /// Entry and session creates.
    pub(crate) creates: Acked,
    /// Heartbeats: a promoted replica must have every expiry the local deadline counts on.
    pub(crate) heartbeats: Acked,
}

impl Acks {
    pub(crate) fn new(
        primary: Arc<Primary>,
        timeout: Duration,
        replicas: usize,
        wait: Duration,
    ) -> Self {
        Acks {
            creates: Acked::new(primary.clone(), timeout, replicas, wait),
            heartbeats: Acked::new(primary, timeout, replicas, wait),
        }
    }
}

/// One connection of acknowledged calls, made on first use and again after a failure.
pub(crate) struct Acked {
    primary: Arc<Primary>,
    config: AsyncConnectionConfig,
    replicas: usize,
    wait: Duration,
    /// The connection, the generation of the primary it goes to, and its number.
    slot: AsyncMutex<Option<(u64, u64, MultiplexedConnection)>>,
    /// The number of the next connection made (from 1).
    made: AtomicU64,
    /// A connection left with a call cut short, to be replaced at the next call (0: none).
    spoilt: AtomicU64,
}

impl Acked {
    pub(crate) fn new(
        primary: Arc<Primary>,
        timeout: Duration,
        replicas: usize,
        wait: Duration,
    ) -> Self {
        Acked {
            primary,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout)),
            replicas,
            wait,
            slot: AsyncMutex::new(None),
            made: AtomicU64::new(1),
            spoilt: AtomicU64::new(0),
        }
    }

    /// The connection to use, and its number.
    async fn connection(&self, op: &'static str) -> Result<(u64, MultiplexedConnection)> {
        let mut slot = self.slot.lock().await;
        let (client, generation) = self.primary.client();
        let spoilt = self.spoilt.load(Ordering::SeqCst);
        if let Some((_, n, con)) = slot
            .as_ref()
            .filter(|(g, n, _)| *g == generation && *n != spoilt)
        {
            return Ok((*n, con.clone()));
        }
        let con = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| self.primary.failed(op, e))?;
        let n = self.made.fetch_add(1, Ordering::SeqCst);
        *slot = Some((generation, n, con.clone()));
        Ok((n, con))
    }

    /// Runs `script` and then `WAIT`s for the replicas, on this connection. Fails with a
    /// temporary error if fewer replicas than required acknowledged in time. A write the script
    /// made stays (the caller's retry finds it, and its `WAIT` covers it).
    pub(crate) async fn run(
        &self,
        op: &'static str,
        script: &Op,
        group: &Group,
        args: &Args,
    ) -> Result<Value> {
        let (n, mut con) = self.connection(op).await?;
        // Cut short (the caller gave up waiting), the call leaves its script or its `WAIT`
        // queued on the connection, which would hold up the next call: the connection goes.
        let mut unfinished = Unfinished(Some((self, n)));
        let res = async {
            let value = self
                .primary
                .runner
                .run(&mut con, script, group.key(), args)
                .await?;
            let acked: usize = redis::cmd("WAIT")
                .arg(self.replicas)
                .arg(self.wait.as_millis().max(1) as u64)
                .query_async(&mut con)
                .await?;
            Ok::<_, redis::RedisError>((value, acked))
        }
        .await;
        unfinished.0 = None;
        match res {
            Ok((value, acked)) if acked >= self.replicas => Ok(value),
            Ok(_) => {
                // Also what a primary that Sentinel replaced sees: its replicas left it.
                self.primary.suspect();
                Err(temporary(
                    op,
                    "fewer replicas than required acknowledged in time",
                ))
            }
            Err(e) => {
                // A broken connection must not serve a WAIT for writes it never carried.
                self.spoilt.store(n, Ordering::SeqCst);
                Err(self.primary.failed(op, e))
            }
        }
    }
}

/// Marks the connection of a call cut short as spoilt (see [`Acked::run`]): the next call
/// makes a new one. (Only that connection: a newer one in its place stays.)
struct Unfinished<'a>(Option<(&'a Acked, u64)>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some((acked, n)) = self.0 {
            acked.spoilt.store(n, Ordering::SeqCst);
        }
    }
}
