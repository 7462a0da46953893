//! Settings of the ZooKeeper backend, and their validation.

use std::fmt;
use std::time::Duration;

use fencelock::{Error, Result};
use fencelock_net::{split_host_port, TlsConfig};
use zookeeper_client as zk;

use crate::layout::check_zk_path;
use crate::ZooKeeperBackend;

mod connect_string;
use connect_string::{is_host, split_chroot};

/// How long [`ZooKeeperConfig::connect`] and every session start wait for the cluster by
/// default (10 s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The smallest session TTL the backend accepts by default (2 s). The server raises a smaller
/// request to its own minimum (`2 × tickTime`, 4 s with the default tick of 2 s) anyway; the
/// session then reports the negotiated timeout.
pub const DEFAULT_MIN_TTL: Duration = Duration::from_secs(2);

/// The longest connect timeout accepted (one hour): longer values are refused, not clamped.
pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(3600);

/// The shortest connect timeout accepted (10 ms, the `fencelock` command's least): a shorter
/// one was accepted, and every session start then failed as a temporary error, where a wrong
/// setting is refused at once (black-box round 39).
pub const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(10);

/// The port of a server given without one.
const DEFAULT_PORT: u16 = 2181;

/// Who may change or delete the nodes fencelock creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AclMode {
    /// `world:anyone` may do anything (ZooKeeper's `OPEN_ACL_UNSAFE`, Curator's default).
    #[default]
    Open,
    /// Everyone may read; only clients authenticated as the creator (the `digest` identity of
    /// [`ZooKeeperConfig::digest_auth`]) may create, change or delete: ACL `auth::cdrwa` plus
    /// `world:anyone:r` on every node fencelock creates, parents included.
    ///
    /// ZooKeeper checks deletion against the *parent's* ACL, so this protects entries only
    /// under parents fencelock created in this mode (or that carry an equivalent ACL). Every
    /// process that contends on the same locks must use the same identity.
    CreatorDelete,
}

/// Settings of a [`ZooKeeperBackend`]; made by [`ZooKeeperBackend::builder`].
///
/// ```no_run
/// # async fn f() -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock_zookeeper::{AclMode, TlsConfig, ZooKeeperBackend};
///
/// let backend = ZooKeeperBackend::builder("zk1:2281,zk2:2281,zk3:2281")
///     .chroot("/apps/billing")
///     .tls(TlsConfig::from_ca_file("/etc/zookeeper/ca.pem")?
///         .with_identity_files("/etc/zookeeper/client.pem", "/etc/zookeeper/client.key")?)
///     .sasl_digest_md5("billing", "s3cret")
///     .connect_timeout(Duration::from_secs(5))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZooKeeperConfig {
    connect_string: String,
    chroot: Option<String>,
    create_chroot: bool,
    connect_timeout: Duration,
    acl: AclMode,
    digest: Option<(String, String)>,
    sasl: Option<(String, String)>,
    tls: Option<TlsConfig>,
    min_ttl: Duration,
}

impl fmt::Debug for ZooKeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperConfig")
            // It may carry a user and password (refused by validation, but shown here before it
            // runs).
            .field(
                "connect_string",
                &fencelock_net::redact(&self.connect_string),
            )
            .field("chroot", &self.chroot)
            .field("create_chroot", &self.create_chroot)
            .field("connect_timeout", &self.connect_timeout)
            .field("acl", &self.acl)
            .field("digest_user", &self.digest.as_ref().map(|(u, _)| u))
            .field("sasl_user", &self.sasl.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls)
            .field("min_ttl", &self.min_ttl)
            .finish()
    }
}

impl ZooKeeperConfig {
    /// Settings for the cluster at `connect_string`: ZooKeeper's usual
    /// `host:port[,host:port...][/chroot]` (the servers may carry a `tcp://` scheme).
    pub fn new(connect_string: impl Into<String>) -> Self {
        ZooKeeperConfig {
            connect_string: connect_string.into(),
            chroot: None,
            create_chroot: false,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            acl: AclMode::Open,
            digest: None,
            sasl: None,
            tls: None,
            min_ttl: DEFAULT_MIN_TTL,
        }
    }

    /// Roots every path of the backend at `path` (an absolute ZooKeeper path such as
    /// `/apps/billing`), like a `/chroot` suffix of the connect string. The chroot node must
    /// exist (a typo would otherwise create a new, empty lock area): a session start fails with
    /// [`Error::InvalidConfig`] if it does not, unless [`create_chroot`](Self::create_chroot) is
    /// set.
    pub fn chroot(mut self, path: impl Into<String>) -> Self {
        self.chroot = Some(path.into());
        self
    }

    /// Creates the chroot node (persistent) when a session starts and it is missing.
    pub fn create_chroot(mut self, create: bool) -> Self {
        self.create_chroot = create;
        self
    }

    /// How long to wait for a session to be established (default
    /// [`DEFAULT_CONNECT_TIMEOUT`], from [`MIN_CONNECT_TIMEOUT`] to [`MAX_CONNECT_TIMEOUT`]); past it,
    /// [`connect`](Self::connect) and every session start fail with [`Error::Connect`]. (Once
    /// the session is established, a session start checks its SASL authentication and the
    /// chroot with requests of their own, whose failures are `Error::Backend`.)
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Authenticates every session with the `digest` scheme as `user:password`
    /// (`addauth digest user:password`). Required by [`AclMode::CreatorDelete`].
    pub fn digest_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// Authenticates every session with SASL DIGEST-MD5 as `user` (the servers' JAAS `Server`
    /// section must list it). A session start fails with [`Error::Unauthenticated`] if the
    /// servers refuse the credentials, and also if they accept the connection without
    /// authenticating it (a server without SASL configured).
    pub fn sasl_digest_md5(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.sasl = Some((user.into(), password.into()));
        self
    }

    /// Connects with TLS (the servers' `secureClientPort`). Each server's certificate is
    /// verified against its host in the connect string, which must appear in the
    /// certificate's subject alternative names (an IP address SAN for an address).
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The ACL of every node fencelock creates (default [`AclMode::Open`]).
    pub fn acl(mut self, acl: AclMode) -> Self {
        self.acl = acl;
        self
    }

    /// The smallest TTL the backend accepts (default [`DEFAULT_MIN_TTL`]). Set it to your
    /// servers' `minSessionTimeout` (`2 × tickTime` unless configured) if that is lower.
    /// Between 1 ms and [`MAX_TTL`](crate::MAX_TTL), else [`connect`](Self::connect) fails
    /// with [`Error::InvalidConfig`].
    pub fn min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Checks `namespace`, and `name` in it if given, as a backend of these settings would when
    /// a lock or election is made, without connecting: the core's rules, and ZooKeeper's own
    /// (without a chroot, nothing under the server's `/zookeeper`). Fails with
    /// [`Error::InvalidName`]. A program that takes names from its user can refuse a bad one
    /// before it waits for a cluster.
    pub fn check_names(&self, namespace: &str, name: Option<&str>) -> Result<()> {
        let chrooted = self.chroot.is_some() || split_chroot(&self.connect_string).1.is_some();
        fencelock::validate_namespace(namespace)?;
        crate::layout::namespace_root(namespace, chrooted)?;
        if let Some(name) = name {
            fencelock::validate_name_in(namespace, name)?;
            crate::layout::queue_path_of(namespace, name, chrooted)?;
        }
        Ok(())
    }

    /// Validates the settings and checks that at least one server can be reached (a TCP
    /// connection, and the TLS handshake when TLS is set: no ZooKeeper session is opened).
    ///
    /// Fails with [`Error::InvalidConfig`] for bad settings (a plaintext client at a TLS port
    /// or the reverse included), [`Error::Unauthenticated`] for a client certificate the servers
    /// reject, and [`Error::Connect`] when no server can be reached, saying why for each:
    /// temporary if they refuse or time out (early, as soon as every one refused), permanent
    /// if no name resolves or the servers' certificates are not trusted. Credentials and the
    /// chroot are checked when a session starts.
    pub async fn connect(self) -> Result<ZooKeeperBackend> {
        let resolved = self.resolve()?;
        resolved.reachable().await?;
        Ok(ZooKeeperBackend::from_resolved(resolved))
    }

    fn resolve(self) -> Result<Resolved> {
        // What is shown of a setting goes through `redact`: a password can be taken for a port.
        let invalid = |input: &str, msg: String| {
            let note = fencelock_net::masked_port_note(input);
            Error::invalid_config(fencelock_net::redact(input), format!("{msg}{note}"))
        };
        // Before anything splits it: a password may hold a '/' (taken for a chroot's start) or
        // a ':' (for a port), and what is left of it would be shown in an error as a host or
        // a chroot. Nothing of the string is shown.
        if self.connect_string.contains('@') {
            return Err(invalid(
                "(the connect string, not shown)",
                "an '@' in the connect string: credentials are not taken there (give them with sasl_digest_md5 or digest_auth), and a chroot holding an '@' is given with chroot()".into(),
            ));
        }
        let (servers, from_string) = split_chroot(&self.connect_string);
        if servers.trim().is_empty() {
            return Err(invalid(
                &self.connect_string,
                "the connect string names no server".into(),
            ));
        }
        let mut hosts = Vec::new();
        for server in servers.split(',') {
            let server = server.trim();
            let (scheme, rest) = match server.split_once("://") {
                Some((s, r)) => (Some(s), r),
                None => (None, server),
            };
            match (scheme, &self.tls) {
                (None | Some("tcp"), None) | (None | Some("tcp+tls"), Some(_)) => {}
                (Some("tcp+tls"), None) => return Err(invalid(
                    server,
                    "a tcp+tls:// server needs TLS settings: .tls(TlsConfig::from_ca_file(..)?)"
                        .into(),
                )),
                (Some("tcp"), Some(_)) => {
                    return Err(invalid(
                        server,
                        "TLS is configured, but the server is tcp://".into(),
                    ))
                }
                (Some(other), _) => {
                    return Err(invalid(
                        server,
                        format!("unknown scheme {other:?}: use tcp:// or tcp+tls://"),
                    ))
                }
            }
            // The client takes a chroot after the last server only: one after another server
            // would be dropped, and the locks would live outside the subtree asked for.
            if rest.contains('/') {
                return Err(invalid(
                    &self.connect_string,
                    format!(
                        "{:?} has a path: a chroot goes after the last server only (host:port,host:port/chroot)",
                        fencelock_net::redact(server)
                    ),
                ));
            }
            let Some((host, port)) = split_host_port(rest, Some(DEFAULT_PORT)) else {
                return Err(invalid(
                    server,
                    "not a server address: expected host[:port]".into(),
                ));
            };
            if !is_host(&host) {
                return Err(invalid(
                    server,
                    "not a host name: ASCII letters, digits, '-', '.' and '_' only (punycode for an international one)"
                        .into(),
                ));
            }
            // A server named twice is one server: moving a session off a hung server must
            // not take it to the same one under its second name.
            if !hosts
                .iter()
                .any(|(h, p): &(String, u16)| h.eq_ignore_ascii_case(&host) && *p == port)
            {
                hosts.push((host, port));
            }
        }
        let chroot = match (from_string, self.chroot.as_deref()) {
            (Some(a), Some(b)) if a != b => {
                return Err(invalid(
                    b,
                    format!("conflicts with the chroot {a:?} of the connect string"),
                ))
            }
            (a, b) => a.or(b).map(str::to_string),
        };
        let chroot = match chroot.as_deref() {
            None | Some("/") => None,
            Some(root) => {
                if !root.starts_with('/') || root.ends_with('/') {
                    return Err(invalid(
                        root,
                        "a chroot must start with '/' and not end with '/'".into(),
                    ));
                }
                // A chroot is a setting (InvalidConfig, whatever is wrong with it), not a name.
                let setting = |e: Error| match e {
                    Error::InvalidName(why) => invalid(root, format!("a chroot: {}", why.reason)),
                    other => other,
                };
                fencelock::validate_namespace(root).map_err(setting)?;
                // From the server's own root: a chroot inside /zookeeper is refused too.
                check_zk_path(root, root, false).map_err(setting)?;
                Some(root.to_string())
            }
        };
        // Session timeouts are whole milliseconds, and 0 is the client's "use the default"
        // (6 s): a TTL that became 0 would run at a TTL nobody asked for.
        if self.min_ttl < Duration::from_millis(1) || self.min_ttl > crate::MAX_TTL {
            return Err(invalid(
                &format!("{:?}", self.min_ttl),
                format!(
                    "the minimum TTL must be at least 1ms and at most {:?}",
                    crate::MAX_TTL
                ),
            ));
        }
        if self.connect_timeout < MIN_CONNECT_TIMEOUT || self.connect_timeout > MAX_CONNECT_TIMEOUT
        {
            return Err(invalid(
                &format!("{:?}", self.connect_timeout),
                format!("the connect timeout must be at least {MIN_CONNECT_TIMEOUT:?} and at most {MAX_CONNECT_TIMEOUT:?}"),
            ));
        }
        for (what, id) in [("digest", &self.digest), ("SASL", &self.sasl)] {
            if let Some((user, _)) = id {
                if user.is_empty() || (what == "digest" && user.contains(':')) {
                    // Only what comes before the ':': `user:password` given as the user is
                    // a common mistake, and the password must not be shown.
                    let shown = match user.split_once(':') {
                        Some((user, _)) => format!("{user}:***"),
                        None => "(empty)".to_string(),
                    };
                    return Err(invalid(
                        &shown,
                        format!("the {what} user must be non-empty and contain no ':'"),
                    ));
                }
            }
        }
        if self.acl == AclMode::CreatorDelete && self.digest.is_none() {
            return Err(invalid(
                "AclMode::CreatorDelete",
                "it needs an identity: set digest_auth(user, password)".into(),
            ));
        }
        if self.tls.as_ref().is_some_and(|t| t.server_name().is_some()) {
            return Err(invalid(
                "server name",
                "ZooKeeper verifies each server's certificate against its host in the connect string: a separate server name is not supported".into(),
            ));
        }
        let scheme = if self.tls.is_some() {
            "tcp+tls://"
        } else {
            "tcp://"
        };
        let each: Vec<String> = hosts
            .iter()
            .map(|(h, p)| match h.contains(':') {
                true => format!("{scheme}[{h}]:{p}"),
                false => format!("{scheme}{h}:{p}"),
            })
            .collect();
        Ok(Resolved {
            servers: each.join(","),
            each,
            hosts,
            chroot,
            create_chroot: self.create_chroot,
            connect_timeout: self.connect_timeout,
            acl: self.acl,
            digest: self.digest,
            sasl: self.sasl,
            tls: self.tls,
            min_ttl: self.min_ttl,
        })
    }
}

/// Validated settings, shared by the backend and its sessions.
#[derive(Clone)]
pub(crate) struct Resolved {
    /// The servers, each with its scheme (`tcp://` or `tcp+tls://`), comma-separated.
    pub(crate) servers: String,
    /// Each server alone, as in `servers`: a session's client talks to one of them (see
    /// [`crate::link`]).
    pub(crate) each: Vec<String>,
    /// Each server's host and port.
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) chroot: Option<String>,
    pub(crate) create_chroot: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) acl: AclMode,
    pub(crate) digest: Option<(String, String)>,
    pub(crate) sasl: Option<(String, String)>,
    pub(crate) tls: Option<TlsConfig>,
    pub(crate) min_ttl: Duration,
}

impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolved")
            .field("servers", &self.servers)
            .field("chroot", &self.chroot)
            .field("connect_timeout", &self.connect_timeout)
            .field("acl", &self.acl)
            .field("digest_user", &self.digest.as_ref().map(|(u, _)| u))
            .field("sasl_user", &self.sasl.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls)
            .finish()
    }
}

static CREATOR_DELETE: [zk::Acl; 2] = [
    zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
    zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
];

impl Resolved {
    /// The ACL of every node we create.
    pub(crate) fn acls(&self) -> zk::Acls<'static> {
        match self.acl {
            AclMode::Open => zk::Acls::anyone_all(),
            AclMode::CreatorDelete => zk::Acls::new(&CREATOR_DELETE),
        }
    }
}

#[cfg(test)]
mod tests;
