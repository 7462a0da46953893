//! Connection settings of the etcd backend.

use std::time::Duration;

use fencelock::{Error, Result};
use fencelock_net::{split_host_port, TlsConfig};

/// The longest any timeout or interval setting may be (one hour): longer values are refused,
/// not silently clamped.
pub const MAX_SETTING: Duration = Duration::from_secs(3600);

/// The shortest any timeout or interval setting may be (10 ms, the `fencelock` command's
/// least connect timeout): a shorter one was accepted, and failed later as a temporary error
/// (or now and then), where a wrong setting is refused at once (black-box round 39).
pub const MIN_SETTING: Duration = Duration::from_millis(10);

/// Settings for [`EtcdBackend::connect_with`](crate::EtcdBackend::connect_with).
///
/// ```no_run
/// # async fn f() -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock_etcd::{EtcdBackend, EtcdConfig, TlsConfig};
///
/// let config = EtcdConfig::new(["https://etcd-1:2379", "https://etcd-2:2379", "https://etcd-3:2379"])
///     .tls(TlsConfig::from_ca_file("/etc/etcd/ca.pem")?
///         .with_identity_files("/etc/etcd/client.pem", "/etc/etcd/client.key")?)
///     .user("billing", "s3cret")
///     .connect_timeout(Duration::from_secs(5));
/// let backend = EtcdBackend::connect_with(config).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// The cluster's client endpoints: `host:port`, `http://host:port`, or `https://host:port`
    /// (with [`tls`](Self::tls)). A bare `host:port` uses TLS when it is configured.
    pub endpoints: Vec<String>,
    /// How long connecting may take before it fails with [`Error::Connect`] (default 5 s).
    pub connect_timeout: Duration,
    /// HTTP/2 keep-alive ping interval on each connection (default 5 s). etcd refuses pings
    /// more frequent than its `--grpc-keepalive-min-time` (5 s by default) by closing the
    /// connection, which breaks every watch on it: keep it at 5 s or above unless the servers
    /// allow less.
    pub keep_alive_interval: Duration,
    /// How long a keep-alive ping may go unanswered before the connection is dropped (default
    /// 3 s): a hung member is noticed after about interval + timeout.
    pub keep_alive_timeout: Duration,
    /// How long a request may wait for its answer to begin (default 10 s), so that a request
    /// sent to a hung member cannot hang. Streams (watches, keep-alives) are not cut by it.
    pub request_timeout: Duration,
    /// User and password, if the cluster has authentication enabled.
    pub user: Option<(String, String)>,
    /// TLS settings, if the cluster serves TLS.
    pub tls: Option<TlsConfig>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            // An endpoint may carry a user and password (refused by validation, but shown here
            // before it runs).
            .field(
                "endpoints",
                &self
                    .endpoints
                    .iter()
                    .map(|e| fencelock_net::redact(e))
                    .collect::<Vec<_>>(),
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("keep_alive_interval", &self.keep_alive_interval)
            .field("keep_alive_timeout", &self.keep_alive_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls)
            .finish()
    }
}

impl EtcdConfig {
    /// Default settings for `endpoints`.
    pub fn new<E: AsRef<str>>(endpoints: impl IntoIterator<Item = E>) -> Self {
        EtcdConfig {
            endpoints: endpoints
                .into_iter()
                .map(|e| e.as_ref().to_string())
                .collect(),
            connect_timeout: Duration::from_secs(5),
            keep_alive_interval: Duration::from_secs(5),
            keep_alive_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            user: None,
            tls: None,
        }
    }

    /// Sets the connect timeout (from [`MIN_SETTING`] to [`MAX_SETTING`], as every timeout and
    /// interval here; checked at the connect, with [`Error::InvalidConfig`]).
    ///
    /// [`Error::InvalidConfig`]: fencelock::Error::InvalidConfig
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the HTTP/2 keep-alive ping interval and timeout.
    pub fn keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive_interval = interval;
        self.keep_alive_timeout = timeout;
        self
    }

    /// Sets the request timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Authenticates as `user` with `password`. The user's role needs read-write permission
    /// on the session's namespace (`etcdctl role grant-permission --prefix=true ROLE readwrite
    /// NAMESPACE/`); lease operations need none.
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// Connects with TLS.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Checks the settings and returns the endpoints as the client wants them (with their
    /// scheme).
    pub(crate) fn validate(&self) -> Result<Vec<String>> {
        if self.endpoints.is_empty() {
            return Err(Error::invalid_config("", "no etcd endpoint given"));
        }
        for (name, d) in [
            ("connect timeout", self.connect_timeout),
            ("keep-alive interval", self.keep_alive_interval),
            ("keep-alive timeout", self.keep_alive_timeout),
            ("request timeout", self.request_timeout),
        ] {
            if d < MIN_SETTING || d > MAX_SETTING {
                return Err(Error::invalid_config(
                    format!("{d:?}"),
                    format!(
                        "the {name} must be at least {MIN_SETTING:?} and at most {MAX_SETTING:?}"
                    ),
                ));
            }
        }
        if let Some((user, _)) = &self.user {
            if user.is_empty() {
                return Err(Error::invalid_config("", "the etcd user name is empty"));
            }
        }
        // Refused here, as ZooKeeper and Redis do, rather than at connect time as a server
        // certificate not trusted.
        if let Some(name) = self.tls.as_ref().and_then(|t| t.server_name()) {
            if rustls::pki_types::ServerName::try_from(name.to_string()).is_err() {
                return Err(Error::invalid_config(
                    name,
                    "the TLS server name is not a DNS name or an IP address",
                ));
            }
        }
        self.endpoints
            .iter()
            .map(|ep| {
                let (scheme, rest) = match ep.split_once("://") {
                    Some((s, r)) => (Some(s), r),
                    None => (None, ep.as_str()),
                };
                if rest.contains('@') {
                    return Err(Error::invalid_config(
                        fencelock_net::redact(ep),
                        "credentials in an endpoint are not used: give them with EtcdConfig::user",
                    ));
                }
                if split_host_port(rest, None).is_none() {
                    return Err(Error::invalid_config(
                        fencelock_net::redact(ep),
                        format!(
                            "not an endpoint: expected host:port{}",
                            fencelock_net::masked_port_note(ep)
                        ),
                    ));
                }
                match (scheme, &self.tls) {
                    (None, None) | (Some("http"), None) => Ok(format!("http://{rest}")),
                    (None, Some(_)) | (Some("https"), Some(_)) => Ok(format!("https://{rest}")),
                    (Some("https"), None) => Err(Error::invalid_config(
                        fencelock_net::redact(ep),
                        "an https:// endpoint needs TLS settings: EtcdConfig::tls(TlsConfig::from_ca_file(..)?)",
                    )),
                    (Some("http"), Some(_)) => Err(Error::invalid_config(
                        fencelock_net::redact(ep),
                        "TLS is configured, but the endpoint is http://",
                    )),
                    (Some(other), _) => Err(Error::invalid_config(
                        fencelock_net::redact(ep),
                        format!("unknown scheme {other:?}: use http:// or https://"),
                    )),
                }
                // Refused here, naming the endpoint: the client's own parse said only
                // "invalid uri" (black-box round 14: `bücher.example:2379`).
                .and_then(|uri| match uri.parse::<tonic::codegen::http::Uri>() {
                    Ok(_) => Ok(uri),
                    Err(e) => Err(Error::invalid_config(
                        fencelock_net::redact(ep),
                        format!("not an endpoint: {e} (a host name is ASCII: punycode for an international one)"),
                    )),
                })
            })
            .collect::<Result<Vec<String>>>()
            .map(|mut uris| {
                // One member named twice (`a:2379`, `http://a:2379`) is one member: counted
                // twice, the client would take it for two when it moves requests off one that
                // stops answering.
                // (Host names are case-insensitive, `A:2379` is `a:2379`; a path is not, but
                // a trailing '/' names nothing.)
                let member = |u: &str| {
                    let (scheme, rest) = u.split_once("://").unwrap_or(("", u));
                    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                    let path = path.trim_end_matches('/');
                    format!("{scheme}://{}{path}", host.to_ascii_lowercase())
                };
                let mut seen = std::collections::HashSet::new();
                uris.retain(|u| seen.insert(member(u)));
                uris
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `user:password` with its `@host` left out reads as a host and a port: the "port" is
    /// not shown.
    #[test]
    fn a_password_taken_for_a_port_is_not_shown() {
        let e = EtcdConfig::new(["http://bob:Hunter2Secret"])
            .validate()
            .unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        assert!(!e.to_string().contains("Hunter2"), "{e}");
        // What is hidden is said to be (an out-of-range port read "127.0.0.1:***" alone:
        // black-box round 39).
        let e = EtcdConfig::new(["127.0.0.1:99999"]).validate().unwrap_err();
        assert!(e.to_string().contains("not a port"), "{e}");
    }

    /// A host name the URI grammar refuses is refused with the endpoint named.
    #[test]
    fn a_host_name_out_of_the_uri_grammar_names_the_endpoint() {
        let e = EtcdConfig::new(["bücher.example:2379"])
            .validate()
            .unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        assert!(e.to_string().contains("bücher.example"), "{e}");
    }

    #[test]
    fn validation() {
        let ok = EtcdConfig::new(["a:1", "http://b:2"]).validate().unwrap();
        assert_eq!(ok, ["http://a:1", "http://b:2"]);
        let twice = EtcdConfig::new(["a:1", "http://a:1", "b:2", "a:1", "A:1", "a:1/"])
            .validate()
            .unwrap();
        assert_eq!(twice, ["http://a:1", "http://b:2"]);
        let bad = |c: EtcdConfig| matches!(c.validate(), Err(Error::InvalidConfig(_)));
        assert!(bad(EtcdConfig::new(Vec::<String>::new())));
        assert!(bad(EtcdConfig::new(["https://a:1"])));
        assert!(bad(EtcdConfig::new(["ftp://a:1"])));
        assert!(bad(EtcdConfig::new(["a"])));
        assert!(bad(EtcdConfig::new(["a:99999"])));
        assert!(bad(EtcdConfig::new(["a:1"]).connect_timeout(Duration::MAX)));
        assert!(bad(EtcdConfig::new(["a:1"]).connect_timeout(Duration::ZERO)));
        // Degenerate ones too (1 ns failed later, as a temporary error: black-box round 39).
        assert!(bad(
            EtcdConfig::new(["a:1"]).connect_timeout(Duration::from_nanos(1))
        ));
        assert!(bad(
            EtcdConfig::new(["a:1"]).keep_alive(Duration::from_nanos(1), Duration::from_nanos(1))
        ));
        assert!(!bad(EtcdConfig::new(["a:1"]).request_timeout(MIN_SETTING)));
        assert!(bad(EtcdConfig::new(["a:1"]).user("", "p")));
        let dbg = format!("{:?}", EtcdConfig::new(["a:1"]).user("u", "secret"));
        assert!(!dbg.contains("secret"));
        let dbg = format!("{:?}", EtcdConfig::new(["http://u:secret@a:1"]));
        assert!(!dbg.contains("secret"), "{dbg}");
        // Credentials in an endpoint are refused (never silently ignored), and not echoed.
        let e = EtcdConfig::new(["http://u:secret@a:1"])
            .validate()
            .unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
