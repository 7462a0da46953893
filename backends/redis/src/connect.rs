//! Connecting to the Redis server: one multiplexed connection (re-established after a
//! failure by redis-rs's `ConnectionManager`), checked within the timeout, with the cause of a
//! failure typed.

use std::time::Duration;

use fencelock::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::{redact, RedisConfig};
use crate::error::{self, NAME};
use crate::layout;

/// Connects `client` as `config` says and checks, within its timeout, that the server answers
/// and lets us publish on fencelock's channels.
pub(crate) async fn connect(
    config: &RedisConfig,
    client: &redis::Client,
) -> Result<ConnectionManager> {
    let manager = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout))
        .set_response_timeout(Some(config.timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(1));
    let connect = async {
        let mut con = client.get_connection_manager_with_config(manager).await?;
        redis::cmd("PING").query_async::<()>(&mut con).await?;
        // Every release publishes on a `fencelock:*` channel from inside its script, and
        // Redis does not undo a script's earlier writes when a later command fails: a user
        // whose ACL forbids that channel is refused here, before anything is changed.
        redis::cmd("PUBLISH")
            // A head channel (`fencelock:h:…`) that no queue has (queue paths hold a '/'),
            // so that an ACL granting exactly fencelock's channels passes.
            .arg(format!("{}:h:probe", layout::KEY_PREFIX))
            .arg("")
            .query_async::<i64>(&mut con)
            .await?;
        Ok::<_, redis::RedisError>(con)
    };
    match tokio::time::timeout(config.timeout, connect).await {
        Ok(Ok(con)) => Ok(con),
        Ok(Err(e)) => Err(match error::map("connect", e) {
            Error::Backend {
                temporary, source, ..
            } => Error::Connect {
                backend: NAME,
                endpoints: redact(&config.url),
                temporary,
                source,
            },
            other => other,
        }),
        Err(_) => Err(Error::Connect {
            backend: NAME,
            endpoints: redact(&config.url),
            temporary: true,
            source: format!("no answer within {:?}", config.timeout).into(),
        }),
    }
}

/// Warns when the server may evict keys: an evicted session key ends a session early, an
/// evicted token counter starts tokens again from 1. (Servers that forbid `CONFIG` say
/// nothing.)
pub(crate) async fn warn_if_evicting(mut con: ConnectionManager) {
    let policy: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut con)
        .await;
    if let Ok(v) = policy {
        if let Some(policy) = v.get(1).filter(|p| p.as_str() != "noeviction") {
            tracing::warn!(
                policy = %policy,
                "the Redis server may evict keys (maxmemory-policy is not noeviction): an evicted \
                 session ends early, an evicted token counter restarts the fencing tokens"
            );
        }
    }
}
