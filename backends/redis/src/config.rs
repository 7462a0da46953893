//! Settings of the Redis backend, and their validation.

use std::time::Duration;

use fencelock::{Error, Result};
pub(crate) use fencelock_net::redact;
use fencelock_net::TlsConfig;
use redis::{ClientTlsConfig, ConnectionAddr, TlsCertificates};

use crate::cluster::ClusterUrl;
use crate::sentinel::{SentinelUrl, Sentinels};
use crate::RedisBackend;

/// How long a connect, and every request, waits for the server by default (5 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest connect or request timeout accepted (one hour): longer values are refused, not
/// clamped.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The shortest [`RedisConfig::timeout`] accepted (10 ms, the `fencelock` command's least connect timeout): a
/// shorter one was accepted, and every connect then failed as a temporary error, where a wrong
/// setting is refused at once (black-box round 39).
pub const MIN_TIMEOUT: Duration = Duration::from_millis(10);

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
///
/// Over TLS, with an ACL user (`rediss://`; the CA that signed the server's certificate, and a
/// client certificate if the server asks for one):
///
/// ```no_run
/// # async fn f() -> fencelock::Result<()> {
/// use fencelock_redis::{RedisConfig, TlsConfig};
///
/// let backend = RedisConfig::new("rediss://app:s3cret@redis-1.internal:6380")
///     .tls(TlsConfig::from_ca_file("/etc/redis/ca.pem")?
///         .with_identity_files("/etc/redis/client.pem", "/etc/redis/client.key")?)
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) url: String,
    pub(crate) timeout: Duration,
    pub(crate) replicas: Option<(usize, Duration)>,
    pub(crate) tls: Option<TlsConfig>,
    /// The sentinels' user (empty: the default user) and password.
    pub(crate) sentinel_credentials: Option<(String, String)>,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("timeout", &self.timeout)
            .field("replicas", &self.replicas)
            .field("tls", &self.tls)
            .field(
                "sentinel_credentials",
                &self.sentinel_credentials.as_ref().map(|(u, _)| (u, "***")),
            )
            .finish()
    }
}

impl RedisConfig {
    /// Settings for the Redis server at `url`: `redis://[user[:password]@]host[:port][/db]`,
    /// `rediss://…` for TLS (see [`tls`](Self::tls)), or a bare `host:port` (TLS if
    /// [`tls`](Self::tls) is set). A user and password log in as that ACL user (`AUTH user
    /// password`); a password alone as the default user. Messages and `Debug` never show the
    /// password. A query or fragment (`?db=1`, `#insecure`) is refused.
    ///
    /// **Behind Sentinel**: `redis+sentinel://[user[:password]@]host[:port][,host[:port]…]/
    /// MASTER[/db]` (`rediss+sentinel://` for TLS to the sentinels and the servers; a sentinel
    /// without a port is on 26379; at most 64). Every sentinel is asked at once where the
    /// primary of `MASTER` is (`SENTINEL GET-MASTER-ADDR-BY-NAME`, each within the timeout, the
    /// address a majority names winning as soon as it is in, else the one named most a
    /// quarter of a second after the first answer, so a hung sentinel delays nothing), and
    /// the server named must say it is a primary (`ROLE`). The user and password
    /// are the servers' (sentinels: [`sentinel_credentials`](Self::sentinel_credentials)). After a failover, requests
    /// fail with temporary errors (retried) until the sentinels name the new primary: a request
    /// that fails as a failover makes it fail (a broken connection, a timeout, `READONLY`, too
    /// few replica acknowledgements) has them asked again, and heartbeats ask once a second at
    /// most (a primary demoted by `SENTINEL FAILOVER` goes on accepting writes for seconds).
    /// Sessions are suspended meanwhile, then live again on the new primary if it has their
    /// key, or lost (at the next heartbeat, or at the local deadline): never resurrected. A
    /// master name a majority of the listed sentinels do not know is [`Error::InvalidConfig`]
    /// (fewer, the others silent: temporary); no sentinel answering,
    /// [`Error::Connect`] (temporary). Such a connect asks the sentinels, then connects to the
    /// primary and checks its role, each within the [`timeout`](Self::timeout): it may take
    /// a few times as long. With [`wait_for_replicas`](Self::wait_for_replicas) a
    /// failover by a killed or paused primary loses no grant; `SENTINEL FAILOVER` only with
    /// every replica counted (see the README's Redis section).
    ///
    /// **Redis Cluster**: `redis+cluster://[user[:password]@]host[:port][,host[:port]…]`
    /// (`rediss+cluster://` for TLS; a node without a port is on 6379; at most 64, the client
    /// finds the others): see the crate's docs for how locks are spread over the shards.
    /// [`wait_for_replicas`](Self::wait_for_replicas) is refused with it.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            timeout: DEFAULT_TIMEOUT,
            replicas: None,
            tls: None,
            sentinel_credentials: None,
        }
    }

    /// Connects over TLS, trusting only the certificate authorities of `tls` (and presenting
    /// its client certificate, for a server with `tls-auth-clients yes`). The URL must be
    /// `rediss://` or a bare `host:port`; the server's certificate is verified against the
    /// URL's host (an IP address SAN for an address), so [`TlsConfig::with_server_name`] is
    /// refused: connect by the name on the certificate. Without this setting a `rediss://` URL
    /// trusts the system's certificate store. A wrong setting fails the connect with a
    /// permanent error: a plaintext server ([`Error::InvalidConfig`](fencelock::Error::InvalidConfig)),
    /// an untrusted server certificate ([`Error::Connect`](fencelock::Error::Connect)), a
    /// refused client certificate
    /// ([`Error::Unauthenticated`](fencelock::Error::Unauthenticated)).
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long a connect and each request wait for the server (default [`DEFAULT_TIMEOUT`];
    /// from [`MIN_TIMEOUT`] to [`MAX_TIMEOUT`]). A connect that fails may take up to half a second more: a
    /// probe of the server, which tells a wrong TLS setting from a server that is down, ends.
    /// On a Redis Cluster each attempt of a request (and each connect to a node) waits at most
    /// a second of it, so that a hung node is given up for its replica sooner.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// After creating an entry (or a session), waits until `replicas` replicas acknowledged it
    /// (Redis `WAIT`, at most `timeout`, at least 1 ms and shorter than [`timeout`](Self::timeout)
    /// and, since heartbeats wait too, under a third of each session's TTL),
    /// and fails the acquisition with a temporary error (retried) if fewer did. With it, a
    /// replica promoted after the primary's crash has every entry and token counter a holder
    /// was granted on: the grant and the fencing token survive a failover to an acknowledging
    /// replica. Heartbeats are acknowledged the same way (a heartbeat that fewer replicas
    /// acknowledged counts as failed: the session is suspended, and lost at its local deadline
    /// if it stays so), so that a promoted replica never expires a session before that
    /// session's own deadline. The price: with fewer replicas than `replicas` answering, no
    /// lock is granted and held locks are lost at the deadline. Each session's creates and
    /// heartbeats each go through a connection of their own, opened at first use (`WAIT`
    /// blocks the connection it runs on: two more connections per session). Releases
    /// are not waited for. Off by default (at most [`MAX_REPLICAS`]).
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// Behind Sentinel, logs in to the sentinels as `user` (empty: the default user) with
    /// `password` (sentinels with `requirepass`, or ACL users of their own); the URL's user
    /// and password are the servers'. Without it the sentinels are asked without credentials.
    /// A wrong one fails the connect with
    /// [`Error::Unauthenticated`](fencelock::Error::Unauthenticated) when no sentinel lets us
    /// in. Only with a `redis+sentinel://` URL.
    pub fn sentinel_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.sentinel_credentials = Some((user.into(), password.into()));
        self
    }

    /// Checks the settings: a URL the client parses, timeouts within bounds. Returns what to
    /// connect to.
    pub(crate) fn validate(&self) -> Result<Target> {
        check_timeout("timeout", self.timeout, MIN_TIMEOUT)?;
        check_no_query(&self.url)?;
        if let Some((n, t)) = self.replicas {
            if n == 0 || n > MAX_REPLICAS {
                return Err(Error::invalid_config(
                    n.to_string(),
                    format!("replicas must be between 1 and {MAX_REPLICAS}"),
                ));
            }
            // (1 ms at least: Redis's `WAIT` counts whole ms, and `WAIT n 0` blocks for ever.)
            check_timeout("replica timeout", t, Duration::from_millis(1))?;
            if t >= self.timeout {
                return Err(Error::invalid_config(
                    format!("{t:?}"),
                    "the replicas' timeout must be shorter than the request timeout",
                ));
            }
        }
        if let Some(sentinel) = SentinelUrl::parse(&self.url)? {
            if self.tls.is_some() && !sentinel.tls {
                return Err(Error::invalid_config(
                    redact(&self.url),
                    "TLS settings need a rediss+sentinel:// URL",
                ));
            }
            let base = self.client(&sentinel.server_url("primary"))?;
            let clients = sentinel
                .sentinels
                .iter()
                .map(|host| {
                    let client = self.client(&sentinel.sentinel_url(host))?;
                    Ok((host.clone(), self.with_sentinel_credentials(client)?))
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(Target::Sentinel(
                base,
                Sentinels::new(clients, sentinel.master),
            ));
        }
        if self.sentinel_credentials.is_some() {
            return Err(Error::invalid_config(
                "sentinel credentials",
                "only with a redis+sentinel:// URL",
            ));
        }
        if let Some(cluster) = ClusterUrl::parse(&self.url)? {
            return self.cluster(&cluster);
        }
        Ok(Target::Server(self.client(&self.full_url())?))
    }

    /// The clients of a `redis+cluster://` URL.
    fn cluster(&self, url: &ClusterUrl) -> Result<Target> {
        let bad = |why: &str| Error::invalid_config(redact(&self.url), why.to_string());
        if self.tls.is_some() && !url.tls {
            return Err(bad("TLS settings need a rediss+cluster:// URL"));
        }
        if self.replicas.is_some() {
            // `WAIT` counts the writes of the connection it runs on, and the cluster client
            // multiplexes every session's requests to a node on one connection.
            return Err(bad(
                "wait_for_replicas is not supported on Redis Cluster in this version",
            ));
        }
        let urls: Vec<String> = url.nodes.iter().map(|h| url.node_url(h)).collect();
        let nodes = urls
            .iter()
            .map(|u| self.client(u))
            .collect::<Result<Vec<_>>>()?;
        let mut builder = redis::cluster::ClusterClientBuilder::new(urls)
            // Each attempt, and each connect, within a second at most: a hung node (whose
            // slots fail over to its replica meanwhile) holds a request, or the client's slot
            // refresh, for that long, not for the whole timeout (with 5 s, a paused primary
            // stalled its shard for 6 s in the adversity suite; with 1 s, 2.5 s).
            .connection_timeout(self.timeout.min(CLUSTER_ATTEMPT))
            .response_timeout(self.timeout.min(CLUSTER_ATTEMPT))
            // A request fails within the timeout (the core retries it, with its own backoff):
            // redis-rs would otherwise retry for many seconds, from 1.28 s apart.
            .overall_response_timeout(Some(self.timeout))
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(500);
        if let Some(certs) = self.certificates() {
            builder = builder.certs(certs);
        }
        let client = builder.build().map_err(|e| bad(&e.to_string()))?;
        Ok(Target::Cluster(client, nodes))
    }

    /// [`validate`](Self::validate) for a URL of one server: a Sentinel or cluster URL is
    /// refused, with `why` (the caller needs independent servers).
    pub(crate) fn validate_server(&self, why: &'static str) -> Result<redis::Client> {
        match self.validate()? {
            Target::Server(client) => Ok(client),
            _ => Err(Error::invalid_config(redact(&self.url), why)),
        }
    }

    /// `client` logging in with the sentinel credentials, if any.
    fn with_sentinel_credentials(&self, client: redis::Client) -> Result<redis::Client> {
        let Some((user, password)) = &self.sentinel_credentials else {
            return Ok(client);
        };
        let info = client.get_connection_info().clone();
        let mut settings = info.redis_settings().clone().set_password(password);
        if !user.is_empty() {
            settings = settings.set_username(user);
        }
        redis::Client::open(info.set_redis_settings(settings))
            .map_err(|e| Error::invalid_config(redact(&self.url), e.to_string()))
    }

    /// A client of the server at `url`, with the TLS settings; port 0 refused (nothing can be
    /// reached there: a connect would fail as if the server were down, a temporary error), and
    /// a user without a password (redis-rs logs in only with a password: the connection would
    /// run as the default user, with its permissions, and nothing would say so).
    fn client(&self, url: &str) -> Result<redis::Client> {
        let client = self.client_unchecked(url)?;
        let settings = client.get_connection_info().redis_settings();
        // (An empty password is none: redis-rs sends no `AUTH` for it either.)
        if settings.username().is_some() && settings.password().is_none_or(str::is_empty) {
            return Err(Error::invalid_config(
                redact(&self.url),
                "a user name without a password (it would log in as the default user)",
            ));
        }
        match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(_, 0) | ConnectionAddr::TcpTls { port: 0, .. } => Err(
                Error::invalid_config(redact(&self.url), "port 0: expected the server's port"),
            ),
            _ => Ok(client),
        }
    }

    fn client_unchecked(&self, url: &str) -> Result<redis::Client> {
        let bad = |e: redis::RedisError| {
            let note = fencelock_net::masked_port_note(&self.url);
            Error::invalid_config(redact(&self.url), format!("{e}{note}"))
        };
        let Some(tls) = &self.tls else {
            return redis::Client::open(url).map_err(bad);
        };
        if !url.starts_with("rediss://") {
            return Err(Error::invalid_config(
                redact(&self.url),
                "TLS settings need a rediss:// URL (or a bare host:port)",
            ));
        }
        if tls.server_name().is_some() {
            return Err(Error::invalid_config(
                "server name",
                "the Redis client verifies the server's certificate against the URL's host: \
                 connect by the name on the certificate",
            ));
        }
        let certificates = Self::certificates_of(tls);
        redis::Client::build_with_tls(url, certificates).map_err(bad)
    }

    /// The certificates of the TLS settings, if any.
    fn certificates(&self) -> Option<TlsCertificates> {
        self.tls.as_ref().map(Self::certificates_of)
    }

    fn certificates_of(tls: &TlsConfig) -> TlsCertificates {
        TlsCertificates {
            client_tls: tls.identity_pem().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.as_bytes().to_vec(),
                client_key: key.as_bytes().to_vec(),
            }),
            root_cert: Some(tls.ca_pem().as_bytes().to_vec()),
        }
    }

    /// The URL with its scheme: a bare `host:port` is `rediss://` with TLS settings, else
    /// `redis://`.
    fn full_url(&self) -> String {
        match (self.url.contains("://"), &self.tls) {
            (true, _) => self.url.clone(),
            (false, Some(_)) => format!("rediss://{}", self.url),
            (false, None) => format!("redis://{}", self.url),
        }
    }

    /// Connects (see [`RedisBackend::connect_with`]).
    pub async fn connect(self) -> Result<RedisBackend> {
        RedisBackend::connect_with(self).await
    }
}

/// The longest one attempt of a request to a cluster's node waits (see [`RedisConfig::timeout`]
/// for the whole request).
pub(crate) const CLUSTER_ATTEMPT: Duration = Duration::from_secs(1);

/// What a [`RedisConfig`] connects to.
pub(crate) enum Target {
    /// One server.
    Server(redis::Client),
    /// The primary the sentinels name (the client's address is a placeholder for it).
    Sentinel(redis::Client, Sentinels),
    /// A Redis Cluster, and a client of each node of the URL.
    Cluster(redis::cluster::ClusterClient, Vec<redis::Client>),
}

/// Refuses a query or a fragment in a server's URL (`redis://`, `rediss://`, a bare
/// `host:port`, the Sentinel and Cluster forms): redis-rs would ignore `?db=1` (database 0 instead), take `?protocol=resp3`
/// (replies fencelock does not read), and turn the server certificate's check off for
/// `#insecure`. (Sockets, `unix://`, keep their query: it is how they name a database.)
fn check_no_query(url: &str) -> Result<()> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    if scheme.contains("unix") {
        return Ok(());
    }
    // In the user info they are a password's (which should be percent-encoded, but is not
    // the question here).
    let after_user = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    if after_user.contains(['?', '#']) {
        return Err(Error::invalid_config(
            redact(url),
            "a Redis URL takes no query or fragment: the database is its path (redis://HOST:PORT/DB)",
        ));
    }
    Ok(())
}

fn check_timeout(what: &str, t: Duration, least: Duration) -> Result<()> {
    if t < least || t > MAX_TIMEOUT {
        return Err(Error::invalid_config(
            format!("{what} {t:?}"),
            format!("must be at least {least:?} and at most one hour"),
        ));
    }
    Ok(())
}
