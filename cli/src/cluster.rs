//! From the command line's cluster URL and options to a started session.

use std::sync::Arc;

use fencelock::backend::Backend;
use fencelock::{Error, Session};
use fencelock_etcd::{EtcdBackend, EtcdConfig, TlsConfig};
use fencelock_zookeeper::ZooKeeperBackend;

use crate::args::ClusterArgs;

/// A parsed cluster URL.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Url {
    /// `etcd://h1:2379,h2:2379[/namespace]`.
    Etcd {
        endpoints: Vec<String>,
        namespace: Option<String>,
    },
    /// `zk://h1:2181,h2:2181[/chroot]`.
    ZooKeeper {
        servers: String,
        chroot: Option<String>,
    },
    /// `redis://host:6379[/db]`: one server (efficiency locks; see `fencelock-redis`).
    Redis { addr: String, db: Option<String> },
}

fn bad(url: &str, reason: &'static str) -> Error {
    Error::invalid_config(redact(url), reason)
}

/// `url` without the credentials a Redis URL may carry (`redis://user:password@host`), for
/// messages.
fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    // Everything up to the last '@' may be credentials (a password may hold a '/').
    let rest = match rest.rsplit_once('@') {
        Some((_, hosts)) => format!("***@{hosts}"),
        None => rest.to_string(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{rest}"),
        None => rest,
    }
}

impl Url {
    /// Parses `etcd://…`, `zk://…` (also `zookeeper://…`) or `redis://…`.
    pub(crate) fn parse(url: &str) -> Result<Url, Error> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            bad(
                url,
                "not a cluster URL: etcd://HOST:PORT[,HOST:PORT...][/NAMESPACE], zk://HOST:PORT[,HOST:PORT...][/CHROOT] or redis://HOST:PORT[/DB]",
            )
        })?;
        let (hosts, path) = match rest.split_once('/') {
            Some((h, p)) => (h, Some(p.trim_end_matches('/'))),
            None => (rest, None),
        };
        let hosts: Vec<&str> = hosts.split(',').collect();
        if hosts.iter().any(|h| h.trim().is_empty()) {
            return Err(bad(url, "an empty host in the list"));
        }
        if hosts.iter().any(|h| h.contains(char::is_whitespace)) {
            return Err(bad(url, "a host with white space"));
        }
        let path = path.filter(|p| !p.is_empty());
        match scheme {
            "etcd" => Ok(Url::Etcd {
                endpoints: hosts.iter().map(|h| h.to_string()).collect(),
                namespace: path.map(str::to_string),
            }),
            "zk" | "zookeeper" => Ok(Url::ZooKeeper {
                servers: hosts.join(","),
                chroot: path.map(|p| format!("/{p}")),
            }),
            "redis" => {
                let [addr] = hosts.as_slice() else {
                    return Err(bad(url, "one Redis server (redis://HOST:PORT[/DB])"));
                };
                if path.is_some_and(|db| db.parse::<u32>().is_err()) {
                    return Err(bad(url, "the path of a Redis URL is a database number"));
                }
                Ok(Url::Redis {
                    addr: addr.to_string(),
                    db: path.map(str::to_string),
                })
            }
            _ => Err(bad(url, "unknown scheme (etcd://, zk:// or redis://)")),
        }
    }
}

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
            "no cluster: pass --endpoints etcd://HOST:PORT, zk://HOST:PORT or redis://HOST:PORT, or set FENCELOCK_ENDPOINTS",
        )
    })?;
    let tls = tls(args)?;
    if args.user.is_some() != args.password.is_some() {
        return Err(Error::invalid_config(
            "--user / --password",
            "authentication needs both a user and a password (FENCELOCK_USER, FENCELOCK_PASSWORD)",
        ));
    }
    match Url::parse(url)? {
        Url::Etcd {
            endpoints,
            namespace,
        } => {
            let namespace = match (namespace, &args.namespace) {
                (Some(a), Some(b)) if &a != b => {
                    return Err(Error::invalid_config(
                        format!("{a} and {b}"),
                        "two different namespaces: the URL's path and --namespace",
                    ))
                }
                (Some(a), _) => a,
                (None, Some(b)) => b.clone(),
                (None, None) => fencelock::DEFAULT_NAMESPACE.to_string(),
            };
            let scheme = if tls.is_some() { "https" } else { "http" };
            let endpoints: Vec<String> = endpoints
                .iter()
                .map(|e| format!("{scheme}://{e}"))
                .collect();
            let mut config = EtcdConfig::new(endpoints).connect_timeout(args.connect_timeout);
            if let Some(tls) = tls {
                config = config.tls(tls);
            }
            if let (Some(u), Some(p)) = (&args.user, &args.password) {
                config = config.user(u, p);
            }
            Ok((
                Arc::new(EtcdBackend::connect_with(config).await?),
                namespace,
            ))
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
            if let (Some(u), Some(p)) = (&args.user, &args.password) {
                config = config.sasl_digest_md5(u, p);
            }
            let namespace = args
                .namespace
                .clone()
                .unwrap_or_else(|| fencelock::DEFAULT_NAMESPACE.to_string());
            Ok((Arc::new(config.connect().await?), namespace))
        }
        Url::Redis { addr, db } => {
            if tls.is_some() {
                return Err(Error::invalid_config(
                    "--cacert",
                    "TLS is not supported by the Redis backend in this version",
                ));
            }
            let auth = match (&args.user, &args.password) {
                (Some(u), Some(p)) => format!("{}:{}@", percent(u), percent(p)),
                _ => String::new(),
            };
            let db = db.map(|d| format!("/{d}")).unwrap_or_default();
            let config = fencelock_redis::RedisConfig::new(format!("redis://{auth}{addr}{db}"))
                .timeout(args.connect_timeout);
            let namespace = args
                .namespace
                .clone()
                .unwrap_or_else(|| fencelock::DEFAULT_NAMESPACE.to_string());
            Ok((Arc::new(config.connect().await?), namespace))
        }
    }
}

/// `s` with the characters a URL's user info cannot hold percent-encoded.
fn percent(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Connects and starts a session.
pub(crate) async fn session(args: &ClusterArgs) -> fencelock::Result<Session> {
    let (backend, namespace) = connect(args).await?;
    Session::builder(backend)
        .namespace(namespace)
        .ttl(args.ttl)
        .start_timeout(args.connect_timeout.max(std::time::Duration::from_secs(1)) * 2)
        .start()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            Url::parse("etcd://a:2379,b:2379/svc/locks").unwrap(),
            Url::Etcd {
                endpoints: vec!["a:2379".into(), "b:2379".into()],
                namespace: Some("svc/locks".into())
            }
        );
        assert_eq!(
            Url::parse("etcd://a:2379").unwrap(),
            Url::Etcd {
                endpoints: vec!["a:2379".into()],
                namespace: None
            }
        );
        assert_eq!(
            Url::parse("zk://a:2181,b:2181/apps/billing/").unwrap(),
            Url::ZooKeeper {
                servers: "a:2181,b:2181".into(),
                chroot: Some("/apps/billing".into())
            }
        );
        assert_eq!(
            Url::parse("redis://a:6379/2").unwrap(),
            Url::Redis {
                addr: "a:6379".into(),
                db: Some("2".into())
            }
        );
        for bad in [
            "a:2379",
            "redis://a:1,b:2",
            "redis://a:1/x",
            "memcached://a:1",
            "etcd://",
            "etcd://a:1,,b:2",
            "zk://a b:1",
        ] {
            assert!(
                matches!(Url::parse(bad), Err(Error::InvalidConfig(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn errors_never_show_a_password() {
        for url in [
            "redis://app:s3cret@a:1,b:2",
            "redis://app:s3cret@a:1/x",
            "redis://app:s3cret@a b:1",
            "redis://app:s3/cret@a:1/x",
            "memcached://app:s3cret@a:1",
        ] {
            let e = Url::parse(url).unwrap_err().to_string();
            assert!(!e.contains("s3cret") && !e.contains("cret@"), "{e}");
            assert!(e.contains("***@"), "{e}");
        }
        assert_eq!(redact("redis://u:p@h:1/2"), "redis://***@h:1/2");
        assert_eq!(redact("etcd://a:1,b:2/ns"), "etcd://a:1,b:2/ns");
    }
}
