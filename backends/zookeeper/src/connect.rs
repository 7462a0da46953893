//! Connecting ZooKeeper clients: the reachability check of `connect()`, and one client per
//! session, with the cause of a failure found and typed.
//!
//! zookeeper-client retries a failed connection until the session timeout and then reports
//! only `Timeout`, whatever went wrong. So each attempt fails eagerly, and a failed attempt
//! probes the servers (name, port, TLS) to learn why: a wrong setting ends the wait at once
//! with a permanent error; servers that are down or starting are waited for until the connect
//! timeout, and the error says so.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencelock::backend::{Backoff, Retry};
use fencelock::{Error, Result};
use fencelock_net::{connect_error, probe, Probe, FIRST_HEDGE};
use tokio::time::{timeout_at, Instant};
use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::config::Resolved;
use crate::error::{self, NAME};

mod close;
mod speaks;
pub(crate) use close::Unconfirmed;

/// How long a server is given to take a new session before the next one is asked too (the
/// first is not given up: whichever takes it first is kept). A healthy server takes one in
/// milliseconds; one that takes the connection and never answers (hung, stopped) held the
/// connect up for a second when asked first (a random one is), for its whole share before
/// that (half the connect timeout with two servers).
const HEDGE_AFTER: Duration = Duration::from_millis(300);

impl Resolved {
    /// Probes every server at once (at most until the connect timeout): `Ok` as soon as one is
    /// reachable as configured. (Not once all have answered: a server that accepts connections
    /// and never answers takes a probe's whole second, and held every connect up for it.)
    pub(crate) async fn reachable(&self) -> Result<()> {
        use futures::StreamExt;
        let deadline = Instant::now() + self.connect_timeout;
        let mut pending: futures::stream::FuturesUnordered<_> = self.probes(deadline).collect();
        let mut probes = Vec::new();
        while let Some((server, p)) = pending.next().await {
            if p == Probe::Reachable {
                return Ok(());
            }
            probes.push((server, p));
        }
        Err(connect_error(NAME, &self.servers, &probes))
    }

    /// Probes every server at once, each bounded by `deadline` (and by 2 s).
    async fn probe_all(&self, deadline: Instant) -> Vec<(String, Probe)> {
        futures::future::join_all(self.probes(deadline)).await
    }

    /// Server `server` (an index in [`Resolved::hosts`]) as `host:port`.
    fn shown(&self, server: usize) -> String {
        let (host, port) = &self.hosts[server];
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }

    /// A probe of each server, bounded by `deadline` (and by 2 s).
    fn probes(
        &self,
        deadline: Instant,
    ) -> impl Iterator<Item = impl std::future::Future<Output = (String, Probe)> + '_> + '_ {
        let within = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(100), Duration::from_secs(2));
        self.hosts
            .iter()
            .enumerate()
            .map(move |(i, (host, port))| async move {
                let p = probe(host, *port, self.tls.as_ref(), within).await;
                (self.shown(i), p)
            })
    }

    /// The connector of the clients of a session with `session_timeout`: credentials, TLS,
    /// timeouts. Detached, except to close: dropping a client must not close the session,
    /// which moves between clients (see [`crate::link`]); [`Resolved::close_session`] does.
    fn connector(&self, session_timeout: Duration, detached: bool) -> Result<zk::Connector> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(session_timeout)
            .with_connection_timeout(connection_timeout(session_timeout))
            .with_fail_eagerly();
        if detached {
            connector = connector.with_detached();
        }
        if let Some((user, password)) = &self.digest {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        if let Some((user, password)) = &self.sasl {
            connector =
                connector.with_sasl(zk::SaslOptions::digest_md5(user.clone(), password.clone()));
        }
        if let Some(tls) = &self.tls {
            let bad = |e: zk::Error| Error::invalid_config("TLS", e.to_string());
            let mut options = zk::TlsOptions::new()
                .with_pem_ca(tls.ca_pem())
                .map_err(bad)?;
            if let Some((cert, key)) = tls.identity_pem() {
                options = options.with_pem_identity(cert, key).map_err(bad)?;
            }
            connector = connector.with_tls(options);
        }
        Ok(connector)
    }

    /// Opens one session with the requested timeout, rooted at the chroot (which must exist
    /// unless `create_chroot`), through one server: the servers are tried one at a time from
    /// a random one on. Bounded by the connect timeout. Returns the client and its server's
    /// index in [`Resolved::each`].
    pub(crate) async fn connect_client(
        &self,
        session_timeout: Duration,
    ) -> Result<(zk::Client, usize)> {
        let connector = self.connector(session_timeout, true)?;
        let deadline = Instant::now() + self.connect_timeout;
        // Each try goes round the servers from where the last one stopped.
        let next = AtomicUsize::new(fastrand::usize(..self.each.len()));
        let (client, server) = Retry::new(Backoff::new())
            .until(deadline)
            .run(
                || self.try_each_server(&connector, &next, deadline),
                Error::is_temporary,
            )
            .await?;
        debug!(session = %client.session_id(), timeout = ?client.session_timeout(), server = %self.each[server], "zookeeper session established");
        // The checks below go to the server that took the session, which may hang right after
        // its handshake: bounded by the same deadline.
        let hung = |what: &str| {
            Error::Connect {
            backend: NAME,
            endpoints: self.each[server].clone(),
            temporary: true,
            source: format!("the server took the session, then did not answer ({what}) within the connect timeout").into(),
        }
        };
        if self.sasl.is_some() {
            let users = timeout_at(deadline, client.list_auth_users())
                .await
                .map_err(|_| hung("authentication check"))?;
            // `whoami` came with ZooKeeper 3.7: an older server cannot say, and is trusted to
            // enforce SASL (`sessionRequireClientSASLAuth`) as configured.
            let users = match users {
                Err(zk::Error::Unimplemented) => {
                    warn!(server = %self.each[server], "this ZooKeeper server (before 3.7) cannot tell whether SASL authenticated the session; not checked");
                    None
                }
                other => Some(other.map_err(|e| error::map("check authentication", e))?),
            };
            if users.is_some_and(|users| !users.iter().any(|u| u.scheme() == "sasl")) {
                return Err(Error::Unauthenticated {
                    backend: NAME,
                    source: "the ZooKeeper servers accepted the connection without authenticating it by SASL (is SASL configured on them?)".into(),
                });
            }
        }
        if let Some(root) = &self.chroot {
            timeout_at(deadline, self.check_chroot(&client, root))
                .await
                .map_err(|_| hung("chroot check"))??;
        }
        Ok((self.rooted(client)?, server))
    }

    /// One try at a session: the servers from `next` on, each asked [`HEDGE_AFTER`] after the
    /// one before (at once if it failed) while those asked before are still waited for, then
    /// asked again on new connections while none answers (see [`FIRST_HEDGE`]), until one
    /// takes it (the others' attempts are dropped: a session a slow server opens meanwhile
    /// owns nothing and expires); if none does, the servers are probed to say why (the error
    /// is temporary only if waiting can help).
    async fn try_each_server(
        &self,
        connector: &zk::Connector,
        next: &AtomicUsize,
        deadline: Instant,
    ) -> Result<(zk::Client, usize)> {
        use futures::StreamExt;
        let mut failure = String::new();
        // What each server that answered as another service said. A failure of that server
        // alone (a stale entry of the connect string, its port reused, must not fail a
        // cluster, healthy or coming back); a wrong setting when every server did.
        let n = self.each.len();
        let mut foreign: Vec<Option<String>> = vec![None; n];
        let mut running = futures::stream::FuturesUnordered::new();
        let (mut asked, mut due) = (0, Instant::now());
        // Once every server was asked, those still silent are asked again, on new
        // connections, after `FIRST_HEDGE`, then twice as long each time (as `hedged` does):
        // a connection whose answers are lost (a middlebox dropping one direction) stays
        // silent for good, one opened once the path healed is answered (black-box round 16).
        // Only beside attempts still running: a server that failed is asked again by the
        // caller's retry, after its backoff.
        let mut again = FIRST_HEDGE;
        loop {
            let now = Instant::now();
            let first_round = asked < n && (running.is_empty() || now >= due);
            let hedge = asked >= n && !running.is_empty() && now >= due && due < deadline;
            if first_round || hedge {
                let server = next.fetch_add(1, Ordering::Relaxed) % n;
                asked += 1;
                due = if asked < n {
                    now + HEDGE_AFTER
                } else {
                    let at = now + again;
                    again *= 2;
                    at
                };
                // Within the deadline (the client itself waits 0.6 x the TTL).
                let attempt = timeout_at(deadline, connector.clone().connect(&self.each[server]));
                let foreign = self.another_service(server, deadline, HEDGE_AFTER);
                running.push(async move {
                    tokio::select! {
                        outcome = attempt => (server, Ok(outcome)),
                        e = foreign => (server, Err(e)),
                    }
                });
                continue;
            }
            let done = if due < deadline && !running.is_empty() {
                match timeout_at(due, running.next()).await {
                    Ok(done) => done,
                    // The next attempt is due.
                    Err(_) => continue,
                }
            } else {
                running.next().await
            };
            let Some((server, outcome)) = done else {
                break;
            };
            failure = match outcome {
                Err(answer) => {
                    foreign[server] = Some(answer);
                    failure // the others' failure is the one said
                }
                Ok(Ok(Ok(client))) => return Ok((client, server)),
                Ok(Ok(Err(zk::Error::AuthFailed))) => {
                    return Err(Error::Unauthenticated {
                        backend: NAME,
                        source: "the ZooKeeper servers refused the credentials (SASL or digest) or require authentication".into(),
                    })
                }
                Ok(Ok(Err(e))) if retry_connect(&e) => e.to_string(),
                Ok(Ok(Err(e))) => return Err(error::map("connect", e)),
                // The server named unless it is the only one (the error names it already).
                Ok(Err(_)) if n == 1 => "no session within the connect timeout".to_string(),
                Ok(Err(_)) => format!("{}: no session within the connect timeout", self.each[server]),
            };
            // Failed: the next server at once, in the first round (later, the schedule of
            // the silent ones' hedges stands).
            if asked < n {
                due = Instant::now();
            }
        }
        debug!(error = %failure, "no zookeeper session yet: probing the servers");
        let said = |(server, answer): (usize, &String)| {
            (
                self.shown(server),
                format!(
                    "it does not answer as a ZooKeeper server (it said {answer:?}: another service at that address?)"
                ),
            )
        };
        let foreign: Vec<(String, String)> = foreign
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().map(|a| said((i, a))))
            .collect();
        if foreign.len() == n {
            let (server, why) = foreign.into_iter().next().expect("n > 0");
            return Err(Error::invalid_config(server, why));
        }
        // Only foreign answers and silence (a hung server cut off at the deadline).
        if failure.is_empty() {
            failure = "no session within the connect timeout".to_string();
        }
        let probes = self.probe_all(deadline).await;
        // A foreign server's probe finds it reachable: said of it instead.
        let probes: Vec<(String, Probe)> = probes
            .into_iter()
            .filter(|(server, _)| !foreign.iter().any(|(f, _)| f == server))
            .collect();
        let noted: String = foreign
            .iter()
            .map(|(server, why)| format!("; {server}: {why}"))
            .collect();
        Err(match connect_error(NAME, &self.servers, &probes) {
            // Reachable, yet no session: say what the client said.
            Error::Connect {
                backend,
                endpoints,
                temporary,
                source,
            } if probes.iter().any(|(_, p)| *p == Probe::Reachable) => Error::Connect {
                backend,
                endpoints,
                temporary,
                source: format!("{failure} ({source}){noted}").into(),
            },
            Error::Connect {
                backend,
                endpoints,
                temporary,
                source,
            } if !noted.is_empty() => Error::Connect {
                backend,
                endpoints,
                temporary,
                source: format!("{source}{noted}").into(),
            },
            other => other,
        })
    }

    /// Attaches a new client to the existing session `info` through server `server` (an
    /// index in [`Resolved::each`]), rooted at the chroot. The handshake confirms the session
    /// alive at the leader; `SessionExpired` if it is not.
    pub(crate) async fn attach(
        &self,
        session_timeout: Duration,
        info: zk::SessionInfo,
        server: usize,
    ) -> std::result::Result<zk::Client, AttachError> {
        let connector = self
            .connector(session_timeout, true)
            .map_err(AttachError::Refused)?;
        match connector
            .with_session(info)
            .connect(&self.each[server])
            .await
        {
            Ok(client) => self.rooted(client).map_err(AttachError::Refused),
            Err(zk::Error::SessionExpired) => Err(AttachError::Expired),
            Err(zk::Error::AuthFailed) => Err(AttachError::Refused(Error::Unauthenticated {
                backend: NAME,
                source: "the ZooKeeper server refused the credentials when the session moved to it"
                    .into(),
            })),
            Err(e) => Err(AttachError::Failed(e)),
        }
    }

    /// The client rooted at the chroot, if there is one.
    fn rooted(&self, client: zk::Client) -> Result<zk::Client> {
        match &self.chroot {
            Some(root) => client
                .chroot(root.clone())
                .map_err(|_| Error::invalid_config(root, "invalid chroot")),
            None => Ok(client),
        }
    }

    /// Checks that the chroot exists, or creates it if asked to.
    async fn check_chroot(&self, client: &zk::Client, root: &str) -> Result<()> {
        match client.check_stat(root).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) if self.create_chroot => {
                let options = zk::CreateMode::Persistent.with_acls(self.acls());
                match client.mkdir(root, &options).await {
                    Ok(()) | Err(zk::Error::NodeExists) => Ok(()),
                    Err(e) => Err(error::map("create chroot", e)),
                }
            }
            Ok(None) => Err(Error::invalid_config(
                root,
                "the chroot node does not exist: create it (zkCli.sh create PATH), or with the library \
                 set ZooKeeperConfig::create_chroot(true)",
            )),
            Err(e) => Err(error::map("check chroot", e)),
        }
    }
}

/// Why a client could not be attached to an existing session.
#[derive(Debug)]
pub(crate) enum AttachError {
    /// The cluster says the session expired.
    Expired,
    /// A setting or the credentials were refused: trying another server will not help.
    Refused(Error),
    /// That server did not take it (down, hung, electing): another may.
    Failed(zk::Error),
}

/// Whether a failed session establishment may succeed if tried again: no server answered in
/// time, or the connections failed (the ensemble is electing a leader, restarting, or the
/// setting is wrong: the probes tell).
fn retry_connect(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::Timeout | zk::Error::NoHosts | zk::Error::ConnectionLoss | zk::Error::Custom(_)
    )
}

/// The connection timeout asked of the client for a session timeout `requested`: the largest
/// it allows (3/5 of the session timeout). It sets the client's tick to 3/40 of the session
/// timeout, and so the idle time after which it pings to 9/40: our heartbeat, sent more often
/// than that, replaces its pings instead of adding to them (see [`heartbeat_interval`]).
pub(crate) fn connection_timeout(requested: Duration) -> Duration {
    requested * 3 / 5
}

/// How often to send our heartbeat so that the client never pings by itself: a little under
/// its idle-before-ping time, computed as `zookeeper-client` does from the negotiated session
/// timeout and the connection timeout we asked for (if the server negotiated a longer timeout,
/// the client falls back to a tick of 1/20 of it); at most a third of the session timeout.
pub(crate) fn heartbeat_interval(negotiated: Duration, requested: Duration) -> Duration {
    let ct = connection_timeout(requested);
    let tick = if ct.is_zero() || ct > negotiated * 3 / 5 {
        negotiated / 20
    } else {
        ct / 8
    }
    .max(Duration::from_millis(1));
    let ping_idle = Duration::from_secs(10).min(tick * 3);
    (ping_idle * 8 / 9).min(negotiated / 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_replace_the_clients_pings() {
        let s = Duration::from_secs(10);
        // The client pings after 9/40 of S idle; we beat every 1/5 of S.
        assert_eq!(heartbeat_interval(s, s), Duration::from_secs(2));
        // Negotiated down by the server (its minimum): the connection timeout asked for is
        // then above 3/5 of S, and the client's tick is S/20, its idle time 3/20 of S.
        let four = Duration::from_secs(4);
        assert_eq!(heartbeat_interval(four, s), four * 3 / 20 * 8 / 9);
        // Negotiated up: the tick stays a eighth of the connection timeout asked for.
        assert_eq!(
            heartbeat_interval(Duration::from_secs(20), s),
            Duration::from_secs(2)
        );
        // Long sessions: the client pings after 10 s idle at most.
        assert!(
            heartbeat_interval(Duration::from_secs(120), Duration::from_secs(120))
                < Duration::from_secs(10)
        );
    }
}
