//! Configuration of the ZooKeeper backend and the connection of its clients.

use std::fmt;
use std::time::Duration;

use fencelock::backend::Backoff;
use fencelock::{Error, Result};
use tracing::debug;
use zookeeper_client as zk;

use crate::error;
use crate::layout::check_zk_path;
use crate::ZooKeeperBackend;

/// How long [`ZooKeeperConfig::connect`] and every session start wait for the cluster by
/// default (10 s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The smallest session TTL the backend accepts by default (2 s). The server raises a smaller
/// request to its own minimum (`2 × tickTime`, 4 s with the default tick of 2 s) anyway; the
/// session then reports the negotiated timeout.
pub const DEFAULT_MIN_TTL: Duration = Duration::from_secs(2);

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
/// use fencelock_zookeeper::{AclMode, ZooKeeperBackend};
///
/// let backend = ZooKeeperBackend::builder("zk1:2181,zk2:2181,zk3:2181")
///     .chroot("/apps/billing")
///     .connect_timeout(Duration::from_secs(5))
///     .digest_auth("billing", "s3cret")
///     .acl(AclMode::CreatorDelete)
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZooKeeperConfig {
    connect_string: String,
    chroot: Option<String>,
    connect_timeout: Duration,
    acl: AclMode,
    digest: Option<(String, String)>,
    min_ttl: Duration,
}

impl fmt::Debug for ZooKeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperConfig")
            .field("connect_string", &self.connect_string)
            .field("chroot", &self.chroot)
            .field("connect_timeout", &self.connect_timeout)
            .field("acl", &self.acl)
            .field("digest_user", &self.digest.as_ref().map(|(u, _)| u))
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
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            acl: AclMode::Open,
            digest: None,
            min_ttl: DEFAULT_MIN_TTL,
        }
    }

    /// Roots every path of the backend at `path` (an absolute ZooKeeper path such as
    /// `/apps/billing`), like a `/chroot` suffix of the connect string. The chroot node is
    /// created (persistent) by [`connect`](Self::connect) if it is missing.
    pub fn chroot(mut self, path: impl Into<String>) -> Self {
        self.chroot = Some(path.into());
        self
    }

    /// How long to wait for a session to be established (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]); past it, [`connect`](Self::connect) and every session
    /// start fail with [`Error::Connect`].
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

    /// The ACL of every node fencelock creates (default [`AclMode::Open`]).
    pub fn acl(mut self, acl: AclMode) -> Self {
        self.acl = acl;
        self
    }

    /// The smallest TTL the backend accepts (default [`DEFAULT_MIN_TTL`]). Set it to your
    /// servers' `minSessionTimeout` (`2 × tickTime` unless configured) if that is lower.
    pub fn min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Validates the settings, checks that the cluster can be reached (one short-lived
    /// session, bounded by the connect timeout) and creates the chroot node if it is missing.
    pub async fn connect(self) -> Result<ZooKeeperBackend> {
        let resolved = self.resolve()?;
        resolved.probe().await?;
        Ok(ZooKeeperBackend::from_resolved(resolved))
    }

    fn resolve(self) -> Result<Resolved> {
        let invalid = |msg: String| Error::invalid_config("", msg);
        let (servers, from_string) = split_chroot(&self.connect_string);
        if servers.trim().is_empty() {
            return Err(invalid("the connect string names no server".into()));
        }
        let chroot = match (from_string, self.chroot.as_deref()) {
            (Some(a), Some(b)) if a != b => {
                return Err(invalid(format!(
                    "chroot {b:?} conflicts with {a:?} in the connect string"
                )))
            }
            (a, b) => a.or(b).map(str::to_string),
        };
        let chroot = match chroot.as_deref() {
            None | Some("/") => None,
            Some(root) => {
                if !root.starts_with('/') || root.ends_with('/') {
                    return Err(invalid(format!(
                        "chroot {root:?} must start with '/' and not end with '/'"
                    )));
                }
                fencelock::validate_namespace(root)?;
                check_zk_path(root, root, true)?;
                Some(root.to_string())
            }
        };
        if self.connect_timeout.is_zero() {
            return Err(invalid("the connect timeout must be positive".into()));
        }
        if let Some((user, _)) = &self.digest {
            if user.is_empty() || user.contains(':') {
                return Err(invalid(
                    "the digest user must be non-empty and contain no ':'".into(),
                ));
            }
        }
        if self.acl == AclMode::CreatorDelete && self.digest.is_none() {
            return Err(invalid(
                "AclMode::CreatorDelete needs an identity: set digest_auth(user, password)".into(),
            ));
        }
        Ok(Resolved {
            servers: servers.to_string(),
            chroot,
            connect_timeout: self.connect_timeout,
            acl: self.acl,
            digest: self.digest,
            min_ttl: self.min_ttl,
        })
    }
}

/// Whether a failed session establishment may succeed if tried again: no server answered in
/// time, or the connections failed (the ensemble is electing a leader, restarting). Anything
/// else (authentication, a bad connect string) is final.
fn retry_connect(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::Timeout | zk::Error::NoHosts | zk::Error::ConnectionLoss | zk::Error::Custom(_)
    )
}

/// Splits `host:port,...[/chroot]` into the servers and the chroot, as the client parses it:
/// the chroot follows the first '/' of the last server (after its optional scheme).
fn split_chroot(connect_string: &str) -> (&str, Option<&str>) {
    let last_start = connect_string.rfind(',').map_or(0, |i| i + 1);
    let last = &connect_string[last_start..];
    let scheme = ["tcp://", "tcp+tls://"]
        .iter()
        .find(|s| last.starts_with(*s))
        .map_or(0, |s| s.len());
    match last[scheme..].find('/') {
        Some(i) => {
            let at = last_start + scheme + i;
            (&connect_string[..at], Some(&connect_string[at..]))
        }
        None => (connect_string, None),
    }
}

/// Validated settings, shared by the backend and its sessions.
#[derive(Clone)]
pub(crate) struct Resolved {
    pub(crate) servers: String,
    pub(crate) chroot: Option<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) acl: AclMode,
    digest: Option<(String, String)>,
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

    /// Opens one session with the requested timeout, rooted at the chroot if `rooted`.
    /// Bounded by the connect timeout: an unreachable cluster gives [`Error::Connect`].
    pub(crate) async fn connect_client(
        &self,
        session_timeout: Duration,
        rooted: bool,
    ) -> Result<zk::Client> {
        let mut connector = zk::Client::connector().with_session_timeout(session_timeout);
        if let Some((user, password)) = &self.digest {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        // The client gives up by itself after about one session timeout (`Timeout`), which may
        // be much shorter than the connect timeout (a 2 s session while the ensemble elects a
        // leader or restarts): try again until the connect timeout is over.
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let mut backoff = Backoff::new();
        let client = loop {
            let attempt = connector.clone().connect(&self.servers);
            match tokio::time::timeout_at(deadline, attempt).await {
                Ok(Ok(client)) => break client,
                Ok(Err(e)) if retry_connect(&e) && tokio::time::Instant::now() < deadline => {
                    debug!(error = %e, "no zookeeper session yet, trying again");
                    let pause = tokio::time::Instant::now() + backoff.next_delay();
                    tokio::time::sleep_until(pause.min(deadline)).await;
                }
                Ok(Err(e)) => return Err(error::connect(&self.servers, e)),
                Err(_) => {
                    return Err(error::connect(
                        &self.servers,
                        format!(
                            "no session established within the connect timeout of {:?}",
                            self.connect_timeout
                        ),
                    ))
                }
            }
        };
        debug!(session = %client.session_id(), timeout = ?client.session_timeout(), "zookeeper session established");
        match (&self.chroot, rooted) {
            (Some(root), true) => client
                .chroot(root.clone())
                .map_err(|_| Error::invalid_config(root, "invalid chroot")),
            _ => Ok(client),
        }
    }

    /// Checks that the cluster answers and creates the chroot node if needed.
    async fn probe(&self) -> Result<()> {
        let client = self
            .connect_client(self.min_ttl.max(Duration::from_secs(4)), false)
            .await?;
        if let Some(root) = &self.chroot {
            let options = zk::CreateMode::Persistent.with_acls(self.acls());
            match client.mkdir(root, &options).await {
                Ok(()) => {}
                // Someone else's chroot we may not write to: fine if it exists.
                Err(zk::Error::NoAuth)
                    if client.check_stat(root).await.ok().flatten().is_some() => {}
                Err(e) => return Err(error::map("create chroot", e)),
            }
        }
        client
            .check_stat("/")
            .await
            .map_err(|e| error::connect(&self.servers, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chroot_split() {
        assert_eq!(split_chroot("a:1"), ("a:1", None));
        assert_eq!(split_chroot("a:1,b:2/x/y"), ("a:1,b:2", Some("/x/y")));
        assert_eq!(split_chroot("tcp://a:1/x"), ("tcp://a:1", Some("/x")));
        assert_eq!(split_chroot("a:1,tcp://b:2"), ("a:1,tcp://b:2", None));
    }

    #[test]
    fn resolve_rules() {
        assert!(ZooKeeperConfig::new("a:1/x").resolve().is_ok());
        assert!(ZooKeeperConfig::new("a:1/x")
            .chroot("/y")
            .resolve()
            .is_err());
        assert!(ZooKeeperConfig::new("a:1").chroot("x").resolve().is_err());
        assert!(ZooKeeperConfig::new("a:1").chroot("/x/").resolve().is_err());
        assert!(ZooKeeperConfig::new("").resolve().is_err());
        assert!(ZooKeeperConfig::new("a:1")
            .acl(AclMode::CreatorDelete)
            .resolve()
            .is_err());
        assert!(ZooKeeperConfig::new("a:1")
            .digest_auth("u", "p")
            .acl(AclMode::CreatorDelete)
            .resolve()
            .is_ok());
        assert!(ZooKeeperConfig::new("a:1")
            .connect_timeout(Duration::ZERO)
            .resolve()
            .is_err());
        let r = ZooKeeperConfig::new("a:1/").resolve().unwrap();
        assert_eq!(r.chroot, None);
        let dbg = format!(
            "{:?}",
            ZooKeeperConfig::new("a:1").digest_auth("u", "secret")
        );
        assert!(!dbg.contains("secret"));
    }
}
