//! Where the primary is, and the connection to it: one address for a `redis://` URL, the
//! primary the sentinels name for a `redis+sentinel://` one, found again when it moves, or a
//! Redis Cluster for a `redis+cluster://` one (whose client follows the slots' moves itself;
//! pub/sub connections go to one of the URL's nodes, the next one once it fails).
//!
//! Behind Sentinel, a request that fails the way a failover makes requests fail (a broken or
//! refused connection, a timeout, `READONLY` from a demoted primary, `MASTERDOWN`, fewer
//! replica acknowledgements than required) has the sentinels asked again, in the background
//! and at most every [`RESOLVE_EVERY`]; so does every heartbeat, at most every
//! [`CHECK_EVERY`] (a primary demoted by `SENTINEL FAILOVER` fails nothing until the sentinels
//! reconfigure it, seconds later). The failed request itself fails with its temporary error,
//! which the core retries. Once the sentinels
//! name another server that says it is a primary (`ROLE`), every new request goes there: the
//! multiplexed connection is replaced, and the pub/sub and replica-acknowledged connections
//! notice the new generation and reconnect. Nothing is carried over: a session whose key the
//! new primary does not have is lost at its next heartbeat, never resurrected.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use fencelock::{Error, Result};
use redis::aio::ConnectionManager;
use redis::{ConnectionAddr, ErrorKind, RedisError, ServerErrorKind};

use crate::con::RedisConnection;
use crate::config::{redact, RedisConfig, Target};
use crate::connect;
use crate::error::NAME;
use crate::layout::Groups;
use crate::scripts::Runner;
use crate::sentinel::{Located, Sentinels};

mod ask;
mod rebuild;

/// The shortest time between two questions to the sentinels.
pub(crate) const RESOLVE_EVERY: Duration = Duration::from_millis(200);

/// How often heartbeats have the sentinels asked whether the primary moved.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The primary, and how to find it again.
pub(crate) struct Primary {
    config: Arc<RedisConfig>,
    /// The client of the URL (credentials, database, TLS); behind Sentinel, its address is
    /// replaced by the primary's.
    base: redis::Client,
    sentinels: Option<Sentinels>,
    /// On a cluster, a client of each node of the URL: pub/sub connections go to one of them.
    nodes: Vec<redis::Client>,
    /// On a cluster, its client: a new connection after a timeout (see [`Primary::rebuild`]).
    cluster: Option<redis::cluster::ClusterClient>,
    current: StdMutex<Current>,
    /// Whether a resolution (behind Sentinel) or a rebuild (on a cluster) runs.
    resolving: AtomicBool,
    /// When the last resolution started.
    last: StdMutex<Option<Instant>>,
    /// Held while [`Primary::moved_now`] asks; when its last answered question started.
    asking: tokio::sync::Mutex<Option<Instant>>,
    /// Whether the last answer of the sentinels was that they know no master of that name
    /// (warned once, not at every resolution: up to five a second while it lasts).
    master_unknown: AtomicBool,
    /// How the server runs fencelock's scripts.
    pub(crate) runner: Runner,
}

/// How long a cluster node is given to say whether it runs in cluster mode.
pub(crate) const NODE_CHECK: Duration = Duration::from_secs(1);

/// The primary in use.
struct Current {
    /// The primary's client; on a cluster, the client of the node for pub/sub connections.
    client: redis::Client,
    con: RedisConnection,
    /// Bumped each time the primary moves.
    generation: u64,
    /// Behind Sentinel, the configuration epoch the sentinels named this primary with: an
    /// answer of an older one (a sentinel not yet told of a failover) never moves back to
    /// the primary it demoted.
    epoch: u64,
    /// On a cluster, which of the nodes `client` is.
    node: usize,
}

impl Primary {
    /// Connects to the server of `config` (behind Sentinel, to the primary the sentinels
    /// name), within its timeout.
    pub(crate) async fn connect(config: Arc<RedisConfig>, target: Target) -> Result<Arc<Primary>> {
        let (base, sentinels, nodes) = match target {
            Target::Server(client) => (client, None, Vec::new()),
            Target::Sentinel(client, sentinels) => (client, Some(sentinels), Vec::new()),
            Target::Cluster(cluster, nodes) => {
                let first = nodes
                    .first()
                    .cloned()
                    .ok_or_else(|| Error::invalid_config(redact(&config.url), "no node"))?;
                let con = connect::connect_cluster(&config, &cluster, &first).await?;
                // The node that pub/sub connections go to first: a server that answers it
                // runs without cluster mode is a wrong URL (one that does not answer is
                // passed over later, as a node that failed).
                let within = config.timeout.min(NODE_CHECK);
                if connect::not_a_cluster_node(&config, &first, within).await {
                    return Err(Error::invalid_config(
                        redact(&config.url),
                        format!(
                            "{} is not a node of a Redis Cluster",
                            first.get_connection_info().addr()
                        ),
                    ));
                }
                return Ok(Arc::new(Primary {
                    config,
                    base: first.clone(),
                    sentinels: None,
                    nodes,
                    cluster: Some(cluster),
                    current: StdMutex::new(Current {
                        client: first,
                        con: RedisConnection::cluster(con),
                        generation: 0,
                        epoch: 0,
                        node: 0,
                    }),
                    resolving: AtomicBool::new(false),
                    runner: Runner::default(),
                    last: StdMutex::new(None),
                    asking: tokio::sync::Mutex::new(None),
                    master_unknown: AtomicBool::new(false),
                }));
            }
        };
        let mut epoch = 0;
        let (client, con) = match &sentinels {
            None => {
                let con = connect::connect(&config, &base).await?;
                (base.clone(), con)
            }
            Some(s) => {
                // No sentinel answering may be a wrong TLS setting, which is permanent: the
                // sentinels are probed beside the question (plaintext sentinels behind
                // `rediss+sentinel://` waited out the whole timeout before one was probed).
                // A setting found wrong with every one of them: one sentinel of another
                // setting (a TLS rollout half done) while another answers is no reason to
                // fail.
                let locate = async {
                    s.locate(config.timeout)
                        .await
                        .map_err(|e| match e.is_temporary() {
                            true => connect::Failed::Probe(e),
                            false => connect::Failed::Final(e),
                        })
                };
                let probe = || async {
                    let probes = s
                        .clients
                        .iter()
                        .map(|(_, c)| connect::wrong_setting(&config, c));
                    let mut found = futures_util::future::join_all(probes).await;
                    match !found.is_empty() && found.iter().all(Option::is_some) {
                        true => found.swap_remove(0),
                        false => None,
                    }
                };
                let located = connect::probed(&config, probe, locate).await?;
                let at = match located {
                    Located::Primary(host, port, at_epoch) => {
                        epoch = at_epoch;
                        (host, port)
                    }
                    Located::UnknownMaster => {
                        return Err(Error::invalid_config(
                            redact(&config.url),
                            format!("no sentinel monitors a master named {:?}", s.master),
                        ))
                    }
                };
                connect_to(&config, &base, at).await?
            }
        };
        Ok(Arc::new(Primary {
            config,
            base,
            sentinels,
            nodes,
            cluster: None,
            current: StdMutex::new(Current {
                client,
                con: RedisConnection::server(con),
                generation: 0,
                epoch,
                node: 0,
            }),
            resolving: AtomicBool::new(false),
            runner: Runner::default(),
            last: StdMutex::new(None),
            asking: tokio::sync::Mutex::new(None),
            master_unknown: AtomicBool::new(false),
        }))
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The multiplexed connection to the primary, or the cluster (cloned alone: every request
    /// takes it).
    pub(crate) fn con(&self) -> RedisConnection {
        self.current().con.clone()
    }

    /// Whether pub/sub connections now go to a node of a cluster URL that the connect did not
    /// check for cluster mode (it checks the first: see [`Primary::connect`]).
    pub(crate) fn on_unchecked_node(&self) -> bool {
        !self.nodes.is_empty() && self.current().node != 0
    }

    /// Where the queues' keys live: one group, or a cluster's groups.
    pub(crate) fn groups(&self) -> Groups {
        if self.nodes.is_empty() {
            Groups::Single
        } else {
            Groups::Cluster
        }
    }

    /// On a cluster, the node of `client` (a connection of its own failed to it): the next
    /// node's client serves connections of their own from now on.
    pub(crate) fn node_failed(&self, client: &redis::Client) {
        if self.nodes.len() < 2 {
            return;
        }
        let mut cur = self.current();
        if cur.client.get_connection_info().addr() == client.get_connection_info().addr() {
            cur.node = (cur.node + 1) % self.nodes.len();
            cur.client = self.nodes[cur.node].clone();
        }
    }

    /// A client of the primary (for connections of their own: pub/sub, `WAIT`), and its
    /// generation.
    pub(crate) fn client(&self) -> (redis::Client, u64) {
        let c = self.current();
        (c.client.clone(), c.generation)
    }

    /// The settings it connects with.
    pub(crate) fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// How long a request may wait for the server ([`RedisConfig::timeout`]).
    pub(crate) fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// The generation of the primary: connections made for an older one are replaced.
    pub(crate) fn generation(&self) -> u64 {
        self.current().generation
    }

    /// The error of a request of operation `op`, mapped (see [`crate::error::map`]); behind
    /// Sentinel, one that a failover causes has the sentinels asked again (in the background);
    /// on a cluster, a timeout has the connection made again (see [`Primary::rebuild`]).
    pub(crate) fn failed(self: &Arc<Self>, op: &'static str, e: RedisError) -> Error {
        if moved_maybe(&e) {
            self.suspect();
        }
        if e.is_timeout() {
            self.rebuild();
        }
        crate::error::map(op, e)
    }

    /// Asks the sentinels, and moves to the primary they name if it is another one.
    async fn resolve(&self) {
        let Some(sentinels) = &self.sentinels else {
            return;
        };
        let (at, epoch) = match sentinels.locate(self.config.timeout).await {
            Ok(Located::Primary(host, port, epoch)) => {
                if self.master_unknown.swap(false, Ordering::SeqCst) {
                    tracing::info!(master = %sentinels.master, "the sentinels know the master name again");
                }
                ((host, port), epoch)
            }
            Ok(Located::UnknownMaster) => {
                if !self.master_unknown.swap(true, Ordering::SeqCst) {
                    tracing::warn!(master = %sentinels.master, "no sentinel knows the master name any more");
                } else {
                    tracing::debug!(master = %sentinels.master, "no sentinel knows the master name");
                }
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "no sentinel answered");
                return;
            }
        };
        let (older, generation, mut con) = {
            let mut cur = self.current();
            if same_addr(cur.client.get_connection_info().addr(), &at) {
                // Lowered too: sentinels rebuilt count their epochs from 0 again.
                cur.epoch = epoch;
                return;
            }
            (epoch < cur.epoch, cur.generation, cur.con.clone())
        };
        // An older configuration than the current primary's: sentinels not yet told of the
        // failover that made it, naming the primary it demoted, which says it is a primary
        // until they reconfigure it. Followed only once the current one no longer says it is
        // one (sentinels rebuilt, their epochs from 0 again, and a failover since).
        if older && says_primary(&mut con, self.config.timeout).await {
            tracing::debug!(epoch, "an older configuration named: not followed");
            return;
        }
        match connect_to(&self.config, &self.base, at.clone()).await {
            Ok((client, con)) => {
                let mut cur = self.current();
                // Another question, answered meanwhile, may have moved already.
                if cur.generation != generation {
                    return;
                }
                cur.client = client;
                cur.con = RedisConnection::server(con);
                cur.generation += 1;
                cur.epoch = epoch;
                tracing::info!(host = %at.0, port = at.1, "the Redis primary moved (Sentinel)");
            }
            Err(e) => tracing::debug!(error = %e, host = %at.0, port = at.1, "not the primary yet"),
        }
    }
}

/// Whether `e` is what a request meets when the primary moves.
fn moved_maybe(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Io | ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
    ) || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
}

fn same_addr(addr: &ConnectionAddr, (host, port): &(String, u16)) -> bool {
    match addr {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => h == host && p == port,
        _ => false,
    }
}

/// Connects to the server at `at` with the settings of `base`, and checks that it is a
/// primary.
async fn connect_to(
    config: &RedisConfig,
    base: &redis::Client,
    (host, port): (String, u16),
) -> Result<(redis::Client, ConnectionManager)> {
    let info = base.get_connection_info().clone();
    let addr = match info.addr().clone() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.clone(),
            port,
            insecure,
            tls_params,
        },
        _ => ConnectionAddr::Tcp(host.clone(), port),
    };
    let bad = |e: RedisError| Error::invalid_config(redact(&config.url), e.to_string());
    let client = redis::Client::open(info.set_addr(addr)).map_err(bad)?;
    let mut con = connect::connect(config, &client).await?;
    if !says_primary(&mut con, config.timeout).await {
        return Err(Error::Connect {
            backend: NAME,
            endpoints: format!("{host}:{port}"),
            temporary: true,
            source: "the server the sentinels name is not a primary (yet)".into(),
        });
    }
    Ok((client, con))
}

/// Whether the server of `con` answers `ROLE` within `timeout` that it is a primary.
async fn says_primary(con: &mut impl redis::aio::ConnectionLike, timeout: Duration) -> bool {
    let cmd = redis::cmd("ROLE");
    match tokio::time::timeout(timeout, cmd.query_async::<redis::Value>(con)).await {
        Ok(Ok(redis::Value::Array(v))) => {
            matches!(v.first(), Some(redis::Value::BulkString(r)) if r == b"master")
        }
        _ => false,
    }
}
