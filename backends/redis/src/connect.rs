//! Connecting to the Redis server: one multiplexed connection (re-established after a
//! failure by redis-rs's `ConnectionManager`), checked within the timeout, with the cause of a
//! failure typed.

use std::time::Duration;

use fencelock::{Error, Result};
use fencelock_net::{connect_error, probe, Probe};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};

use crate::config::{redact, RedisConfig};
use crate::error::{self, NAME};
use crate::layout;

/// Connects `client` as `config` says and checks, within its timeout, that the server answers
/// and lets us publish on fencelock's channels, and that it is no node of a Redis Cluster (a
/// `redis://` URL to one would meet `MOVED` for most locks).
pub(crate) async fn connect(
    config: &RedisConfig,
    client: &redis::Client,
) -> Result<ConnectionManager> {
    let mut con = connect_node(config, client).await?;
    if cluster_enabled(config, &mut con).await == Some(true) {
        return Err(Error::invalid_config(
            redact(&config.url),
            "the server is a node of a Redis Cluster: connect with redis+cluster://",
        ));
    }
    Ok(con)
}

/// [`connect`] without the cluster check.
async fn connect_node(config: &RedisConfig, client: &redis::Client) -> Result<ConnectionManager> {
    let manager = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout))
        .set_response_timeout(Some(config.timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(1));
    checked(config, client, || {
        client.get_connection_manager_with_config(manager.clone())
    })
    .await
}

/// Whether the server runs with `cluster-enabled yes` (`INFO cluster`); `None` if it does not
/// say (a user without the permission).
async fn cluster_enabled(config: &RedisConfig, con: &mut impl ConnectionLike) -> Option<bool> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("cluster");
    let info = tokio::time::timeout(config.timeout, cmd.query_async::<String>(con))
        .await
        .ok()?
        .ok()?;
    info.lines()
        .find_map(|l| l.trim().strip_prefix("cluster_enabled:"))
        .map(|v| v == "1")
}

/// Connects to the Redis Cluster of `cluster` as [`connect`] does to a server; `probe` is a
/// client of one of its nodes, to tell a wrong setting from a cluster that is down.
pub(crate) async fn connect_cluster(
    config: &RedisConfig,
    cluster: &redis::cluster::ClusterClient,
    probe: &redis::Client,
) -> Result<redis::cluster_async::ClusterConnection> {
    let failed = match checked(config, probe, || cluster.get_async_connection()).await {
        Ok(con) => return Ok(con),
        Err(e) => e,
    };
    // The cluster client reports every failure of its first connections as I/O (a refused
    // password among them), and a server without cluster mode as a bare error: a connect to
    // one node tells a permanent cause apart.
    match connect_node(config, probe).await {
        Err(node) if !node.is_temporary() => Err(node),
        Err(_) => Err(failed),
        Ok(mut con) => match cluster_enabled(config, &mut con).await {
            Some(false) => Err(Error::invalid_config(
                redact(&config.url),
                "the server is not a node of a Redis Cluster: connect with redis://",
            )),
            _ => Err(failed),
        },
    }
}

/// Whether the node of `client` answers, within `within`, that it runs without cluster mode
/// (`INFO cluster`); `false` if it does not answer or does not say. A standalone server named
/// in a cluster URL would take the session's pub/sub connection, and hear none of the
/// cluster's messages: every handoff then waited for a re-check (black-box round 20).
pub(crate) async fn not_a_cluster_node(
    config: &RedisConfig,
    client: &redis::Client,
    within: Duration,
) -> bool {
    let ask = async {
        let mut con = client.get_multiplexed_async_connection().await.ok()?;
        cluster_enabled(config, &mut con).await
    };
    tokio::time::timeout(within, ask).await.ok().flatten() == Some(false)
}

/// A connection that `open` makes, checked within the timeout (see [`connect`]), with a
/// failure typed (probing `client`'s server for a wrong setting). One left unanswered is
/// joined by another (see [`fencelock_net::hedged`]): `open` makes a new one each time.
async fn checked<C, F, O>(config: &RedisConfig, client: &redis::Client, open: O) -> Result<C>
where
    C: ConnectionLike + Send,
    F: std::future::Future<Output = redis::RedisResult<C>> + Send,
    O: Fn() -> F + Sync,
{
    let connect = || async {
        let mut con = open().await?;
        redis::cmd("PING").query_async::<()>(&mut con).await?;
        // Every release publishes on a `fencelock:*` channel from inside its script, and
        // Redis does not undo a script's earlier writes when a later command fails: a user
        // whose ACL forbids that channel is refused here, before anything is changed.
        // A head channel (`fencelock:h:…`) that no queue has (queue paths hold a '/'), an
        // entry's channel that no entry has (entry names hold a '/' too), and a session's own
        // channel that no session has (ids are hex), so that an ACL granting exactly
        // fencelock's channels passes.
        for channel in [
            format!("{}:h:probe", layout::KEY_PREFIX),
            format!("{}:c:probe", layout::KEY_PREFIX),
            format!("{}probe", layout::OWN_PREFIX),
        ] {
            redis::cmd("PUBLISH")
                .arg(channel)
                .arg("")
                .query_async::<i64>(&mut con)
                .await?;
        }
        Ok::<_, redis::RedisError>(con)
    };
    let attempt = async {
        let deadline = tokio::time::Instant::now() + config.timeout;
        let once = || tokio::time::timeout_at(deadline, connect());
        let failed = match fencelock_net::hedged(deadline, once).await {
            Ok(Ok(con)) => return Ok(con),
            Ok(Err(e)) => {
                // The server refused a setting of ours while the connection was being set up
                // (`SELECT` of a database it does not have, `HELLO` it does not know): a
                // permanent server error here is the configuration's, and no retry changes it.
                let refused = matches!(
                    e.kind(),
                    redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
                )
                .then(|| match e.to_string() {
                    // A sentinel answers every command but a few with this.
                    said if said.contains("accepted by Sentinel instances") => {
                        "a sentinel, not a Redis server: name sentinels with \
                         redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER"
                            .to_string()
                    }
                    said => said,
                });
                match error::map("connect", e) {
                    Error::Backend {
                        temporary: false, ..
                    } if refused.is_some() => {
                        return Err(Failed::Final(Error::invalid_config(
                            redact(&config.url),
                            refused.unwrap_or_default(),
                        )))
                    }
                    Error::Backend {
                        temporary, source, ..
                    } => Error::Connect {
                        backend: NAME,
                        endpoints: redact(&config.url),
                        temporary,
                        source,
                    },
                    other => return Err(Failed::Final(other)),
                }
            }
            Err(_) => Error::Connect {
                backend: NAME,
                endpoints: redact(&config.url),
                temporary: true,
                source: format!("no answer within {:?}", config.timeout).into(),
            },
        };
        Err(Failed::Probe(failed))
    };
    probed(config, || wrong_setting(config, client), attempt).await
}

/// How an attempt to reach the server failed (see [`probed`]).
pub(crate) enum Failed {
    /// With an error that stands as it is.
    Final(Error),
    /// With an error that a wrong setting found by the probe replaces (a wrong TLS setting
    /// shows as a silent or broken connection).
    Probe(Error),
}

/// Runs `attempt` (bounded by `config`'s timeout) beside `probe` (a [`wrong_setting`] of the
/// servers the attempt asks): a wrong TLS setting may show as an attempt that hangs (a
/// plaintext server takes a TLS greeting for a command that never ends), so once the attempt
/// takes a while the probe reports such a setting without waiting for the timeout. One probe
/// per attempt: an attempt that fails after the probe started waits for its verdict
/// (bounded), not for another.
pub(crate) async fn probed<T, P>(
    config: &RedisConfig,
    probe: impl Fn() -> P + Sync,
    attempt: impl std::future::Future<Output = std::result::Result<T, Failed>> + Send,
) -> Result<T>
where
    P: std::future::Future<Output = Option<Error>> + Send,
    T: Send,
{
    let started = tokio::time::Instant::now();
    let mut probe_later = std::pin::pin!(async {
        tokio::time::sleep(PROBE_AFTER).await;
        probe().await
    });
    let mut attempt = std::pin::pin!(attempt);
    // Whether the probe ended and found nothing wrong.
    let mut probed_clean = false;
    let outcome = loop {
        tokio::select! {
            outcome = &mut attempt => break outcome,
            found = &mut probe_later, if !probed_clean => match found {
                Some(wrong) => return Err(wrong),
                None => probed_clean = true,
            },
        }
    };
    let failed = match outcome {
        Ok(done) => return Ok(done),
        Err(Failed::Final(e)) => return Err(e),
        Err(Failed::Probe(e)) => e,
    };
    let wrong = if probed_clean {
        None
    } else if started.elapsed() < PROBE_AFTER {
        // A failure before the probe began (a refused or reset connection): probe now.
        probe().await
    } else {
        // Its verdict, if it comes soon: an attempt that timed out is not held much longer.
        tokio::time::timeout_at(started + config.timeout + PROBE_AFTER, probe_later)
            .await
            .unwrap_or(None)
    };
    Err(wrong.unwrap_or(failed))
}

/// A wrong setting that the server shows, if any, as the permanent error it is: redis-rs
/// reports one as a broken, reset or silent connection. Found by probing the server: a
/// plaintext server behind a `rediss://` URL, a TLS one behind `redis://`, an untrusted server
/// certificate, a refused client certificate.
pub(crate) async fn wrong_setting(config: &RedisConfig, client: &redis::Client) -> Option<Error> {
    let within = config.timeout.min(PROBE_TIMEOUT);
    let (host, port, tls) = match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => (host, *port, None),
        redis::ConnectionAddr::TcpTls { host, port, .. } => match config.tls.as_ref() {
            Some(tls) => (host, *port, Some(tls)),
            // With the system's trust store (a bare `rediss://` URL) there is no CA to probe
            // the handshake with, but a server that answers a plaintext PING speaks no TLS.
            None => {
                return answers_plaintext(host, *port, within / 2).await.then(|| {
                    connect_error(
                        NAME,
                        &redact(&config.url),
                        &[(
                            format!("{host}:{port}"),
                            Probe::NotTls("it answers in plaintext: use redis://".into()),
                        )],
                    )
                })
            }
        },
        _ => return None,
    };
    // A TLS greeting that a plaintext Redis takes for the start of a command is never
    // answered (the probe times out), as nothing is by a hung server: only a plaintext server
    // answers a PING. Both asked at once: a plaintext answer settles it without waiting for
    // the handshake to time out (which took longer than a short connect timeout).
    let plaintext =
        || Probe::NotTls("it answers in plaintext: use redis:// without TLS settings".into());
    let verdict = |found: Probe| {
        found.is_permanent().then(|| {
            connect_error(
                NAME,
                &redact(&config.url),
                &[(format!("{host}:{port}"), found)],
            )
        })
    };
    let mut handshake = std::pin::pin!(probe(host, port, tls, within));
    if tls.is_none() {
        // Set up for plaintext: a plaintext answer is what is expected.
        return verdict(handshake.await);
    }
    let mut ping = std::pin::pin!(answers_plaintext(host, port, within / 2));
    // The ping's answer once it came (a completed future is not awaited again); `None` from
    // the loop: the ping was answered first.
    let mut pinged = None;
    let handshake_found = loop {
        tokio::select! {
            found = &mut handshake => break Some(found),
            answered = &mut ping, if pinged.is_none() => {
                if answered {
                    break None;
                }
                pinged = Some(false);
            }
        }
    };
    let found = match handshake_found {
        None => plaintext(),
        Some(Probe::NotTls(_) | Probe::TimedOut) => {
            let answered = match pinged {
                Some(answered) => answered,
                None => ping.await,
            };
            if !answered {
                return None;
            }
            plaintext()
        }
        Some(other) => other,
    };
    verdict(found)
}

/// Whether the server at `host:port` answers a plaintext `PING` within `within` as Redis does:
/// `+PONG`, or an error such as `-NOAUTH` (a TLS server may answer with an alert record, whose
/// first byte is 0x15: not plaintext).
async fn answers_plaintext(host: &str, port: u16, within: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect((host, port)).await?;
        tcp.write_all(b"PING\r\n").await?;
        let mut reply = [0u8; 1];
        let n = tcp.read(&mut reply).await?;
        Ok::<_, std::io::Error>(n > 0 && matches!(reply[0], b'+' | b'-'))
    };
    matches!(tokio::time::timeout(within, exchange).await, Ok(Ok(true)))
}

/// How long a connect may take before a probe starts beside it.
const PROBE_AFTER: Duration = Duration::from_millis(500);

/// The longest a probe waits at each step.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Warns when the server may evict keys: an evicted session key ends a session early, an
/// evicted token counter starts tokens again from 1. Returns the policy if it may evict.
/// (Servers that forbid `CONFIG` say nothing.)
pub(crate) async fn warn_if_evicting(mut con: crate::RedisConnection) -> Option<String> {
    let policy: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut con)
        .await;
    let policy = policy.ok()?.into_iter().nth(1)?;
    if policy == "noeviction" {
        return None;
    }
    tracing::warn!(
        policy = %policy,
        "the Redis server may evict keys (maxmemory-policy is not noeviction): an evicted \
         entry, queue or session frees its lock at once (its holder learns it within a \
         third of the TTL), an evicted token counter restarts the fencing tokens"
    );
    Some(policy)
}
