//! From the command line's cluster URL and options to a started session.

use std::sync::Arc;
use std::time::Duration;

use fencelock::backend::{Backend, Backoff, Retry};
use fencelock::{Error, Session};
use fencelock_etcd::{EtcdBackend, EtcdConfig, TlsConfig};
use fencelock_zookeeper::ZooKeeperBackend;
use tokio::time::Instant;

use crate::args::ClusterArgs;
use crate::credentials::{credentials, percent, Credentials};
use crate::url::Url;

/// The TLS settings the options name, if any.
fn tls(args: &ClusterArgs) -> fencelock::Result<Option<TlsConfig>> {
    if args.cert.is_some() != args.key.is_some() {
        return Err(Error::invalid_config(
            "--cert / --key",
            "a client certificate needs both --cert and --key",
        ));
    }
    let Some(ca) = &args.cacert else {
        if args.cert.is_some() {
            return Err(Error::invalid_config(
                "--cert",
                "a client certificate needs --cacert (TLS)",
            ));
        }
        if args.server_name.is_some() {
            return Err(Error::invalid_config(
                "--server-name",
                "a server name to verify needs --cacert (TLS, etcd only)",
            ));
        }
        return Ok(None);
    };
    let mut tls = TlsConfig::from_ca_file(ca)?;
    if let (Some(cert), Some(key)) = (&args.cert, &args.key) {
        tls = tls.with_identity_files(cert, key)?;
    }
    if let Some(name) = &args.server_name {
        tls = tls.with_server_name(name);
    }
    Ok(Some(tls))
}

/// Connects to the cluster the options name; returns the backend and the namespace to use.
pub(crate) async fn connect(args: &ClusterArgs) -> fencelock::Result<(Arc<dyn Backend>, String)> {
    let url = args.endpoints.as_deref().ok_or_else(|| {
        Error::invalid_config(
            "--endpoints",
            "no cluster: pass --endpoints etcd://HOST:PORT, zk://HOST:PORT, redis://HOST:PORT (or redis+sentinel://, redis+cluster://), or set FENCELOCK_ENDPOINTS",
        )
    })?;
    let tls = tls(args)?;
    let parsed = Url::parse(url)?;
    let is_redis = matches!(
        parsed.url,
        Url::Redis { .. } | Url::RedisSentinel { .. } | Url::RedisCluster { .. }
    );
    let credentials = credentials(args, parsed.user_info, is_redis)?;
    if let Some(c) = &credentials {
        if c.user.is_empty() && !is_redis {
            return Err(Error::invalid_config(
                "--user",
                "the user name is empty (only Redis has a default user)",
            ));
        }
    }
    if args.wait_for_replicas.is_some() && !is_redis {
        return Err(Error::invalid_config(
            "--wait-for-replicas",
            "only with a Redis URL (etcd and ZooKeeper replicate every grant)",
        ));
    }
    if args.sentinel_password.is_some() && !matches!(parsed.url, Url::RedisSentinel { .. }) {
        return Err(Error::invalid_config(
            "--sentinel-password",
            "only with a redis+sentinel:// URL",
        ));
    }
    match parsed.url {
        Url::Etcd {
            endpoints,
            namespace,
        } => {
            let namespace = match (namespace, &args.namespace) {
                (Some(a), Some(b)) if &a != b => {
                    return Err(Error::invalid_config(
                        format!("{a} and {b}"),
                        "two different namespaces: the URL's path and --namespace (or FENCELOCK_NAMESPACE)",
                    ))
                }
                (a, _) => namespace_of(a.as_ref().or(args.namespace.as_ref()), args)?,
            };
            // Without a scheme (the library adds `https://` with TLS, `http://` without): the
            // causes of a failed connect name each endpoint as typed.
            let mut config =
                EtcdConfig::new(endpoints.iter().cloned()).connect_timeout(args.connect_timeout);
            if let Some(tls) = tls {
                config = config.tls(tls);
            }
            if let Some(c) = &credentials {
                config = config.user(&c.user, &c.password);
            }
            // The endpoints as the user gave them, the URL (credentials masked).
            let backend = EtcdBackend::connect_with(config)
                .await
                .map_err(|e| match e {
                    Error::Connect {
                        backend,
                        temporary,
                        source,
                        ..
                    } => Error::Connect {
                        backend,
                        endpoints: fencelock_net::redact(url),
                        temporary,
                        source,
                    },
                    other => other,
                })?;
            Ok((Arc::new(backend), namespace))
        }
        Url::ZooKeeper { servers, chroot } => {
            let mut config =
                ZooKeeperBackend::builder(servers).connect_timeout(args.connect_timeout);
            if let Some(chroot) = chroot {
                config = config.chroot(chroot);
            }
            if let Some(tls) = tls {
                config = config.tls(tls);
            }
            if let Some(c) = &credentials {
                config = config.sasl_digest_md5(&c.user, &c.password);
            }
            let namespace = namespace_of(args.namespace.as_ref(), args)?;
            // ZooKeeper's own rules too (no chroot: nothing under `/zookeeper`), before the
            // connect: against a cluster away they came after it, as 69.
            config.check_names(&namespace, args.asked.name.as_deref())?;
            Ok((Arc::new(config.connect().await?), namespace))
        }
        Url::Redis {
            addr,
            db,
            tls: rediss,
        } => redis(args, credentials, tls, rediss, &addr, Redis::Server, db).await,
        Url::RedisSentinel {
            sentinels,
            master,
            db,
            tls: rediss,
        } => {
            let kind = Redis::Sentinel(&master);
            redis(args, credentials, tls, rediss, &sentinels, kind, db).await
        }
        Url::RedisCluster { nodes, tls: rediss } => {
            redis(args, credentials, tls, rediss, &nodes, Redis::Cluster, None).await
        }
    }
}

/// Which Redis deployment a URL names.
enum Redis<'a> {
    /// One server.
    Server,
    /// The primary the sentinels name for this master name.
    Sentinel(&'a str),
    /// A Redis Cluster.
    Cluster,
}

/// How long past `--connect-timeout` a connection attempt already under way may take to end
/// with its own error (which says why) before it is cut off. Less than the half second
/// `--help` allows: fencelock still has to print the error and exit (against a silent
/// ZooKeeper server on a loaded machine, 500 ms here ended the process 520 ms late; 400 ms,
/// 420 ms late).
const OVERRUN: Duration = Duration::from_millis(300);

/// Connects and starts a session, the two together within `--connect-timeout` (what
/// `--help` promises: a backend's connect and the session's start each have a bound of their
/// own, and in a row they took up to 2.5 times it against a silent ZooKeeper server).
pub(crate) async fn session(args: &ClusterArgs) -> fencelock::Result<Session> {
    let bound = args.connect_timeout;
    let deadline = Instant::now() + bound;
    // Whether the cut-off below came after the connect, while the session started.
    let connected = std::sync::atomic::AtomicBool::new(false);
    // Why the last connect that failed did: a try cut off by the bound is most often the
    // one after it (each try has the whole connect timeout of its own), and says nothing
    // (a refused etcd port read "no session within the connect timeout": black-box round 37).
    let last_failure = std::sync::Mutex::new(None::<String>);
    let start = async {
        // A cluster that refuses connections (a Redis or ZooKeeper server restarting) fails a
        // connect at once: tried again until the bound, as a silent one is waited for.
        let (backend, namespace) = Retry::new(Backoff::new())
            .until(deadline)
            .run(
                || async {
                    let tried = connect(args).await;
                    if let Err(e) = &tried {
                        // With its causes (masked when printed, as every message is); of a
                        // connect, its causes alone (the cut-off's error names the cluster).
                        let from: &dyn std::error::Error = match e {
                            Error::Connect { source, .. } => source.as_ref(),
                            other => other,
                        };
                        *last_failure.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(crate::message::chain(from));
                    }
                    tried
                },
                Error::is_temporary,
            )
            .await?;
        connected.store(true, std::sync::atomic::Ordering::Relaxed);
        // What connecting left of the bound: the session's start retries only that long.
        let left = deadline.saturating_duration_since(Instant::now());
        Session::builder(backend)
            .namespace(namespace)
            .ttl(args.ttl)
            // Running a command: at the local deadline the tree is killed first (see
            // `child::run_under`), and the session closed after it (`main::run`), so that the
            // next holder is granted only once nothing of the command runs. (Reading, it
            // holds nothing: closed at once, as a library user's session is.)
            .close_at_deadline(args.reads_only)
            .start_timeout(left)
            .start()
            .await
    };
    match tokio::time::timeout_at(deadline + OVERRUN, start).await {
        Ok(Ok(session)) => {
            // A ZooKeeper server holds sessions between its minSessionTimeout and
            // maxSessionTimeout (etcd leases have a least TTL too): the lock is held to that TTL
            // (safely: the local deadline follows it), and a failover takes as long, which the
            // user should know of. In whole milliseconds: a ZooKeeper server grants no finer.
            let (granted, asked) = (session.ttl(), args.ttl);
            if granted.as_millis() != asked.as_millis() {
                let than = if granted < asked { "less" } else { "more" };
                say!("the cluster granted a TTL of {granted:?}, {than} than the {asked:?} asked (--ttl)");
            }
            Ok(session)
        }
        // Named as typed, whatever form the backend gave (ZooKeeper's `tcp://`: black-box
        // round 40 read `zk://` and `tcp://` for one endpoint).
        Ok(Err(Error::Connect {
            backend,
            endpoints,
            temporary,
            source,
        })) => {
            let url = args.endpoints.as_deref().unwrap_or_default();
            // One server of several named by the backend (the one that hung at a ZooKeeper
            // chroot check, the primary the sentinels named): kept, before the cause.
            // (Of their masked forms: a password holding a ',' split a list wrongly.)
            let named = hosts_of(&fencelock_net::redact(&endpoints));
            let source = if named == hosts_of(&fencelock_net::redact(url)) {
                source
            } else {
                format!("{}: {source}", named.join(",")).into()
            };
            Err(Error::Connect {
                backend,
                endpoints: fencelock_net::redact(url),
                temporary,
                source,
            })
        }
        Ok(Err(e)) => Err(e),
        // A try in progress ran past the bound: dropped (a session the cluster opened
        // meanwhile owns nothing and expires with its TTL).
        Err(_) => {
            let url = args.endpoints.as_deref().unwrap_or_default();
            // The try cut off had its own error, which said why: what is known of it is said.
            // (A Redis connect has the server answer a `PING`; ZooKeeper's and etcd's only
            // see the port open, which a hung server's is too: nothing more is said of them.)
            let source = match (connected.into_inner(), args.wait_for_replicas) {
                (true, Some(n)) => format!(
                    "no session within the connect timeout ({bound:?}), though the server \
                     answered: fewer than {n} replicas may follow the primary (--wait-for-replicas)"
                ),
                (false, _) => match last_failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
                    Some(why) => format!(
                        "no session within the connect timeout ({bound:?}); the last try that \
                         failed: {why}"
                    ),
                    None => format!("no session within the connect timeout ({bound:?})"),
                },
                _ => format!("no session within the connect timeout ({bound:?})"),
            };
            Err(Error::Connect {
                backend: backend_name(url),
                endpoints: fencelock_net::redact(url),
                temporary: true,
                source: source.into(),
            })
        }
    }
}

/// The `host:port`s of a URL or a list of them, without schemes, credentials or paths, sorted
/// (to tell whether an error names every server of the URL or some).
fn hosts_of(list: &str) -> Vec<String> {
    let mut hosts: Vec<String> = list
        .split(',')
        .map(|item| {
            let item = item.split_once("://").map_or(item, |(_, rest)| rest);
            let item = item.rsplit_once('@').map_or(item, |(_, rest)| rest);
            let end = item.find(['/', '?', '#']).unwrap_or(item.len());
            item[..end].to_string()
        })
        .collect();
    hosts.sort();
    hosts
}

/// The backend a cluster URL names, by its scheme (for an error's tag).
fn backend_name(url: &str) -> &'static str {
    match Url::parse(url).map(|p| p.url) {
        Ok(Url::Etcd { .. }) => "etcd",
        Ok(Url::ZooKeeper { .. }) => "zookeeper",
        Ok(Url::Redis { .. } | Url::RedisSentinel { .. } | Url::RedisCluster { .. }) => "redis",
        // Not reached: the URL parsed before anything was sent.
        Err(_) => "cluster",
    }
}

/// A Redis backend: one server (`hosts` is `HOST:PORT`), the primary that the sentinels at
/// `hosts` name, or the cluster of the nodes at `hosts`.
async fn redis(
    args: &ClusterArgs,
    credentials: Option<Credentials>,
    tls: Option<TlsConfig>,
    rediss: bool,
    hosts: &str,
    kind: Redis<'_>,
    db: Option<String>,
) -> fencelock::Result<(Arc<dyn Backend>, String)> {
    let (sentinel, hosts) = match kind {
        Redis::Sentinel(m) => ("+sentinel", format!("{hosts}/{m}")),
        Redis::Cluster => ("+cluster", hosts.to_string()),
        Redis::Server => ("", hosts.to_string()),
    };
    let auth = match &credentials {
        Some(c) => format!("{}:{}@", percent(&c.user), percent(&c.password)),
        None => String::new(),
    };
    let db = db.map(|d| format!("/{d}")).unwrap_or_default();
    // TLS with --cacert (whatever the scheme), or with the system's trust store for
    // a rediss:// URL alone.
    let scheme = if tls.is_some() || rediss {
        "rediss"
    } else {
        "redis"
    };
    let mut config =
        fencelock_redis::RedisConfig::new(format!("{scheme}{sentinel}://{auth}{hosts}{db}"))
            .timeout(args.connect_timeout);
    if let Some(tls) = tls {
        config = config.tls(tls);
    }
    if let Some(n) = args.wait_for_replicas.filter(|_| !args.reads_only) {
        // Under the request timeout, and under a third of the TTL (heartbeats wait too).
        // (At least 1 ms, Redis's least: a TTL below Redis's least is then said as such.)
        let wait = (args.ttl / 4)
            .min(args.connect_timeout / 2)
            .max(Duration::from_millis(1));
        config = config.wait_for_replicas(usize::from(n), wait);
    }
    if let Some(password) = &args.sentinel_password {
        config = config.sentinel_credentials("", password.as_str());
    }
    let namespace = namespace_of(args.namespace.as_ref(), args)?;
    let backend = config.connect().await?;
    if let Some(policy) = backend.eviction_policy() {
        // The library's warning is a log line, which the command does not show.
        say!(
            "warning: the Redis server may evict keys (maxmemory-policy {policy}): an evicted \
             entry frees its lock at once, and an evicted token counter restarts the fencing \
             tokens"
        );
    }
    Ok((Arc::new(backend), namespace))
}

/// The namespace given (the default if none), checked before anything connects with the name
/// and value the subcommand asks for: a bad one is bad input (78), not one reported after the
/// connect (or, with the cluster away, never: 69 after the connect timeout).
fn namespace_of(given: Option<&String>, args: &ClusterArgs) -> fencelock::Result<String> {
    let namespace = given.map_or(fencelock::DEFAULT_NAMESPACE, String::as_str);
    fencelock::validate_namespace(namespace)?;
    if let Some(name) = &args.asked.name {
        fencelock::validate_name_in(namespace, name)?;
    }
    if let Some(value) = &args.asked.value {
        fencelock::validate_value(value.as_bytes())?;
    }
    Ok(namespace.to_string())
}

#[cfg(test)]
mod tests {
    use super::hosts_of;

    #[test]
    fn hosts_of_a_url_and_of_a_backends_list() {
        let url = hosts_of(&fencelock_net::redact("zk://u:p,w@b:2,a:1/chroot?x=1"));
        assert_eq!(url, ["a:1", "b:2"]);
        assert!(url.iter().all(|h| !h.contains('p') && !h.contains('w')));
        assert_eq!(hosts_of("tcp://b:2,tcp://a:1"), url);
        assert_eq!(hosts_of("tcp://b:2"), ["b:2"]);
        assert_eq!(hosts_of("etcd://[::1]:2379"), ["[::1]:2379"]);
    }
}
