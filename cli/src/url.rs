//! The cluster URL (`etcd://`, `zk://`, `redis://`) taken apart: its hosts, its path and the
//! credentials it may carry (what is done with those is in `credentials.rs`).

use fencelock::Error;
use fencelock_net::redact;

/// A parsed cluster URL: where, and the credentials it carries (if any).
#[derive(PartialEq, Eq)]
pub(crate) struct Parsed {
    pub(crate) url: Url,
    /// The URL's user and password (`None` if it has no `@`); a missing password is empty.
    pub(crate) user_info: Option<(String, Option<String>)>,
}

/// Without the password.
impl std::fmt::Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user_info = self
            .user_info
            .as_ref()
            .map(|(user, password)| (user, password.as_ref().map(|_| "***")));
        f.debug_struct("Parsed")
            .field("url", &self.url)
            .field("user_info", &user_info)
            .finish()
    }
}

/// Where the cluster is.
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
    /// `redis://host:6379[/db]`: one server (efficiency locks; see `fencelock-redis`);
    /// `rediss://…` the same over TLS (trusting `--cacert`, else the system's store).
    Redis {
        addr: String,
        db: Option<String>,
        tls: bool,
    },
    /// `redis+sentinel://s1:26379,s2:26379/MASTER[/db]`: the primary the sentinels name
    /// (`rediss+sentinel://` over TLS).
    RedisSentinel {
        sentinels: String,
        master: String,
        db: Option<String>,
        tls: bool,
    },
    /// `redis+cluster://n1:6379,n2:6379`: a Redis Cluster, found from these nodes
    /// (`rediss+cluster://` over TLS).
    RedisCluster { nodes: String, tls: bool },
}

/// The schemes a cluster URL may have (lower case).
const SCHEMES: [&str; 9] = [
    "etcd",
    "zk",
    "zookeeper",
    "redis",
    "rediss",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
];

const UNKNOWN_SCHEME: &str = "unknown scheme (etcd://, zk://, redis://, rediss://, redis+sentinel://, redis+cluster://; TLS otherwise with --cacert)";

fn bad(url: &str, reason: &'static str) -> Error {
    Error::invalid_config(redact(url), reason)
}

impl Url {
    /// Parses `etcd://…`, `zk://…` (also `zookeeper://…`) or `redis://…`, each optionally
    /// with `USER:PASSWORD@` before the hosts.
    pub(crate) fn parse(url: &str) -> Result<Parsed, Error> {
        let (typed, rest) = url.split_once("://").ok_or_else(|| {
            bad(
                url,
                "not a cluster URL: etcd://HOST:PORT[,HOST:PORT...][/NAMESPACE], zk://HOST:PORT[,HOST:PORT...][/CHROOT] or redis://HOST:PORT[/DB]",
            )
        })?;
        // A scheme is case-insensitive (RFC 3986): `REDIS+CLUSTER://` was an unknown one.
        let scheme = typed.to_ascii_lowercase();
        let scheme = scheme.as_str();
        // Before the hosts are read: `unix:///path` was refused for "an empty host".
        if !SCHEMES.contains(&scheme) {
            return Err(bad(url, UNKNOWN_SCHEME));
        }
        // `etcd://https://h:2379` (a client library's URL, scheme and all): the inner scheme
        // would read as a host and the rest as its port, masked as a possible password.
        if rest.contains("://") {
            return Err(bad(
                url,
                "a second scheme inside the URL: write SCHEME://HOST:PORT (TLS comes from --cacert, or rediss:// for Redis)",
            ));
        }
        // User info ends at the last '@' before the path (a '/' or '@' in a password must be
        // percent-encoded, as in any URL).
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let (user_info, rest) = match rest[..authority_end].rfind('@') {
            Some(at) => (Some(user_info(url, &rest[..at])?), &rest[at + 1..]),
            None => (None, rest),
        };
        // An '@' after the hosts is most likely a password with an unencoded '/': refused, so
        // that no part of it is taken for a host or a namespace (and shown in a message).
        if rest.contains('@') {
            return Err(bad(
                url,
                "an '@' after the hosts: percent-encode '/' and '@' in a user or password (%2F, %40); give a namespace holding '@' with --namespace",
            ));
        }
        // A query or fragment would have been read as part of a host or the namespace
        // (`etcd://h/ns?x=1`, namespace `ns?x=1`), or ignored by a Redis client (`?db=1`).
        if rest.contains(['?', '#']) {
            return Err(bad(
                url,
                if scheme.starts_with("redis") {
                    "a '?' or '#' after the hosts: the URL takes no query or fragment (the database is its path: redis://HOST:PORT/DB)"
                } else {
                    "a '?' or '#' after the hosts: the URL takes no query or fragment (give a namespace holding them with --namespace)"
                },
            ));
        }
        Ok(Parsed {
            url: Url::parse_plain(url, scheme, rest)?,
            user_info,
        })
    }

    /// Parses what follows `scheme://` and the user info.
    fn parse_plain(url: &str, scheme: &str, rest: &str) -> Result<Url, Error> {
        // A path may end in '/' (`zk://h/apps/`, `redis://h/0/`), except an etcd namespace,
        // kept as typed so that `etcd://h/a/` is refused as `--namespace a/` is (it was read
        // as `a`, and `etcd://h//` as the default namespace: black-box round 14).
        let (hosts, path) = match rest.split_once('/') {
            Some((h, p)) if scheme == "etcd" => (h, Some(p)),
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
        // Said here: a client would quote the host, masked as a host with an odd port.
        if hosts.iter().any(|h| h.starts_with('[') != h.contains(']')) {
            return Err(bad(url, "an IPv6 address goes in brackets: [ADDRESS]:PORT"));
        }
        // Said here, without the number (a message masks what may be a password there): the
        // clients said only "did not parse" or "not an endpoint".
        for host in &hosts {
            if let Some((name, port)) = host.rsplit_once(':') {
                if name.is_empty() {
                    return Err(bad(url, "a host without a name (HOST:PORT)"));
                }
                // (A port holding ']' is part of an IPv6 address without a port. Anything else
                // but digits went to the client, whose message masked the port: round 18.)
                let digits = port.bytes().all(|b| b.is_ascii_digit());
                let number = digits && port.parse::<u16>().is_ok_and(|p| p != 0);
                if !port.contains(']') && !number {
                    return Err(bad(url, "a port must be a number from 1 to 65535"));
                }
            }
        }
        // Said of what was typed (the backend saw `http://HOST`, and echoed that).
        let no_port = |h: &&str| {
            h.rsplit_once(':')
                .is_none_or(|(_, port)| port.contains(']'))
        };
        if scheme == "etcd" && hosts.iter().any(no_port) {
            return Err(bad(
                url,
                "an etcd endpoint needs its port: HOST:PORT (often 2379)",
            ));
        }
        let path = path.filter(|p| !p.is_empty());
        // A namespace or chroot is percent-decoded, as the user info is (`my%20app`); a '%'
        // that starts no escape is refused rather than kept as it is (`%zz`, `50%`).
        let decoded_path = || {
            path.map(|p| {
                if !escapes_well_formed(p) {
                    return Err(bad(
                        url,
                        "a '%' in the path that starts no escape (write '%' itself as %25)",
                    ));
                }
                decoded(url, p, "the path is not percent-encoded UTF-8")
            })
            .transpose()
        };
        match scheme {
            "etcd" => Ok(Url::Etcd {
                endpoints: hosts.iter().map(|h| h.to_string()).collect(),
                namespace: decoded_path()?,
            }),
            "zk" | "zookeeper" => Ok(Url::ZooKeeper {
                servers: hosts.join(","),
                chroot: decoded_path()?.map(|p| format!("/{p}")),
            }),
            "redis" | "rediss" => {
                let [addr] = hosts.as_slice() else {
                    return Err(bad(url, "one Redis server (redis://HOST:PORT[/DB])"));
                };
                if path.is_some_and(|db| db.parse::<u32>().is_err()) {
                    return Err(bad(url, "the path of a Redis URL is a database number"));
                }
                Ok(Url::Redis {
                    addr: addr.to_string(),
                    db: path.map(str::to_string),
                    tls: scheme == "rediss",
                })
            }
            "redis+sentinel" | "rediss+sentinel" => {
                let (master, db) = match path.map(|p| p.split_once('/').unwrap_or((p, ""))) {
                    Some((m, db)) if !m.is_empty() => (m, Some(db).filter(|d| !d.is_empty())),
                    _ => {
                        return Err(bad(
                            url,
                            "a Sentinel URL names the master: redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]",
                        ))
                    }
                };
                if db.is_some_and(|db| db.parse::<u32>().is_err()) {
                    return Err(bad(url, "the database of a Sentinel URL is a number"));
                }
                Ok(Url::RedisSentinel {
                    sentinels: hosts.join(","),
                    master: master.to_string(),
                    db: db.map(str::to_string),
                    tls: scheme == "rediss+sentinel",
                })
            }
            "redis+cluster" | "rediss+cluster" => {
                if path.is_some_and(|p| p != "0") {
                    return Err(bad(
                        url,
                        "a Redis Cluster has database 0 only: redis+cluster://HOST:PORT[,HOST:PORT...]",
                    ));
                }
                Ok(Url::RedisCluster {
                    nodes: hosts.join(","),
                    tls: scheme == "rediss+cluster",
                })
            }
            _ => Err(bad(url, UNKNOWN_SCHEME)),
        }
    }
}

/// Whether every '%' of `s` starts an escape: two hexadecimal digits follow it.
fn escapes_well_formed(s: &str) -> bool {
    let b = s.as_bytes();
    (0..b.len()).filter(|&i| b[i] == b'%').all(|i| {
        b.get(i + 1..i + 3)
            .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    })
}

/// `s` of `url` percent-decoded, or an error saying `not_utf8` if that is not UTF-8.
fn decoded(url: &str, s: &str, not_utf8: &'static str) -> Result<String, Error> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| bad(url, not_utf8))
}

/// `USER[:PASSWORD]`, percent-decoded.
fn user_info(url: &str, info: &str) -> Result<(String, Option<String>), Error> {
    // As in the path: a password with a stray '%' was sent as typed, and refused as wrong.
    if !escapes_well_formed(info) {
        return Err(bad(
            url,
            "a '%' in the user info that starts no escape (write '%' itself as %25)",
        ));
    }
    let decode = |s: &str| decoded(url, s, "the user info is not percent-encoded UTF-8");
    Ok(match info.split_once(':') {
        Some((user, password)) => (decode(user)?, Some(decode(password)?)),
        None => (decode(info)?, None),
    })
}

#[cfg(test)]
#[path = "url_tests.rs"]
mod tests;
