//! Connecting to an etcd cluster: every endpoint is checked on its own first, and the client
//! talks only to those that answered.
//!
//! etcd-client balances requests over every endpoint it is given, and a member that refuses
//! connections stays in its rotation: with one of two members down, about half of all requests
//! would fail. So each endpoint is asked for its status (which needs no permission) through a
//! client of its own; the client is then built over the healthy ones, and the others are added
//! back by a background task once they answer. When no endpoint answers, each is diagnosed
//! (name, port, TLS) so that the error says why and is temporary only if waiting can help.

use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use fencelock::backend::{Backoff, Retry};
use fencelock::{Error, Result};
use fencelock_net::{connect_error, hedged, probe, split_host_port, Probe};
use tokio::time::{timeout_at, Instant};
use tracing::{debug, info};

use crate::config::EtcdConfig;
use crate::error::{map, NAME};
use crate::rotation::Rotation;

/// How often every endpoint of a multi-member cluster is checked (see [`monitor`]).
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// How long a member may take to answer a check.
const CHECK_TIMEOUT: Duration = Duration::from_millis(700);

/// How many checks in a row a member must miss to be taken out of the rotation.
const MISSES_TO_REMOVE: u32 = 2;

/// The client options of `config`.
pub(crate) fn options(config: &EtcdConfig) -> ConnectOptions {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_timeout(config.request_timeout)
        .with_keep_alive(config.keep_alive_interval, config.keep_alive_timeout)
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let Some((user, password)) = &config.user {
        options = options
            .with_user(user, password)
            .with_auto_token_refresh(true);
    }
    if let Some(tls) = &config.tls {
        let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(tls.ca_pem()));
        if let Some((cert, key)) = tls.identity_pem() {
            t = t.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = tls.server_name() {
            t = t.domain_name(name);
        }
        options = options.with_tls(t);
    }
    options
}

/// Connects as `config` says, within its connect timeout; returns the client and its
/// rotation (the endpoints that did not answer are left out of it for now).
pub(crate) async fn connect(config: &EtcdConfig) -> Result<(Client, Rotation)> {
    let endpoints = config.validate()?;
    let shown = config.endpoints.join(",");
    let deadline = Instant::now() + config.connect_timeout;
    Retry::new(Backoff::new())
        .until(deadline)
        .run(
            || round(config, &endpoints, &shown, deadline),
            Error::is_temporary,
        )
        .await
}

/// How long the other endpoints' checks are waited for once one endpoint answered.
const STRAGGLERS: Duration = Duration::from_millis(500);

/// One try at connecting: checks every endpoint, and connects through those that answered;
/// if none did, says why (the error is temporary only if waiting can help).
async fn round(
    config: &EtcdConfig,
    endpoints: &[String],
    shown: &str,
    deadline: Instant,
) -> Result<(Client, Rotation)> {
    use futures::stream::{FuturesUnordered, StreamExt};
    // An endpoint as the user gave it (`endpoints` are the client's form, `http://` added), for
    // messages.
    let as_given = |ep: &str| {
        endpoints
            .iter()
            .position(|e| e == ep)
            .and_then(|i| config.endpoints.get(i))
            .map_or_else(|| ep.to_string(), |given| fencelock_net::redact(given))
    };
    let mut checks: FuturesUnordered<_> = endpoints
        .iter()
        .map(|ep| async move { (ep, check(ep, config, deadline).await) })
        .collect();
    let mut healthy = Vec::new();
    let mut failed = Vec::new();
    // A setting wrong at one endpoint (another service answers there): reported if no other
    // endpoint answers, left out like an unreachable one otherwise (a stale port reused by
    // another service listed first failed a healthy cluster).
    let mut wrong = None;
    // Once one member answered, the others are waited for a moment only: a member that takes
    // the connection and never answers (hung, stopped) held every connect up for the whole
    // connect timeout. Those still unchecked are left out for now, as the failed ones.
    let mut others_until = None;
    loop {
        let next = match others_until {
            None => checks.next().await,
            Some(until) => match timeout_at(until, checks.next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
        };
        let Some((ep, r)) = next else {
            break;
        };
        match r {
            Ok(member) => {
                healthy.push((ep.clone(), member));
                others_until.get_or_insert(Instant::now() + STRAGGLERS);
            }
            Err(Error::InvalidConfig(e)) => {
                failed.push((
                    ep.clone(),
                    Error::invalid_config(ep.as_str(), "not an etcd member"),
                ));
                // Said of the endpoint as given (the check saw the client's form).
                let input = if e.input == ep.as_str() {
                    as_given(ep)
                } else {
                    e.input
                };
                wrong.get_or_insert(Error::invalid_config(input, e.reason));
            }
            // Credentials, permissions: the same everywhere, and final.
            Err(e) if !e.is_temporary() && !matches!(e, Error::Connect { .. }) => return Err(e),
            Err(e) => failed.push((ep.clone(), e)),
        }
    }
    drop(checks);
    for ep in endpoints {
        if !healthy.iter().any(|(h, _)| h == ep) && !failed.iter().any(|(f, _)| f == ep) {
            failed.push((
                ep.clone(),
                Error::Timeout {
                    op: "check",
                    after: STRAGGLERS,
                },
            ));
        }
    }
    if !healthy.is_empty() {
        // Endpoints of two clusters: a session would live on whichever answered, and locks
        // taken through one would not exclude those taken through the other (black-box
        // round 37: two processes listing them in two orders).
        if healthy
            .iter()
            .any(|(_, (_, cluster))| *cluster != healthy[0].1 .1)
        {
            let ids: Vec<String> = healthy
                .iter()
                .map(|(ep, (_, cluster))| format!("{}: {cluster:x}", as_given(ep)))
                .collect();
            return Err(Error::invalid_config(
                shown,
                format!(
                    "the endpoints are members of different etcd clusters (cluster ids {}): list one cluster's",
                    ids.join(", ")
                ),
            ));
        }
        let left_out: Vec<String> = failed.into_iter().map(|(ep, _)| ep).collect();
        if !left_out.is_empty() {
            info!(
                ?left_out,
                "etcd endpoints not answering: connecting without them for now"
            );
        }
        let rotation = Rotation::new(
            endpoints.to_vec(),
            left_out,
            options(config),
            healthy[0].1 .1,
        );
        for (ep, (member, _)) in &healthy {
            rotation.learned(ep, *member).await;
        }
        let healthy: Vec<String> = healthy.into_iter().map(|(ep, _)| ep).collect();
        // Bounded as a whole: with a user it authenticates, and a member that stops answering
        // between its check and here (a TLS handshake that never ends) would hold it for ever.
        let within = deadline + config.request_timeout;
        let client = timeout_at(within, Client::connect(&healthy, Some(options(config))))
            .await
            .map_err(|_| Error::Connect {
                backend: NAME,
                endpoints: healthy.join(","),
                temporary: true,
                source: format!(
                    "no connection (and authentication) within {:?}",
                    config.connect_timeout + config.request_timeout
                )
                .into(),
            })?
            .map_err(|e| map("connect", e))?;
        if let ([_], [only]) = (endpoints, healthy.as_slice()) {
            // One endpoint configured: the client is on it alone, and stays so (the rotation
            // puts endpoints back into it, which it then shares with its clones: never with
            // one endpoint), so it is the streams' client there too (with a user, one
            // authentication less).
            rotation.share(only, client.clone()).await;
        }
        return Ok((client, rotation));
    }
    if let Some(e) = wrong {
        return Err(e);
    }
    // Nobody answered: find out why.
    let remaining = deadline.saturating_duration_since(Instant::now());
    let within = remaining.clamp(Duration::from_millis(100), Duration::from_secs(2));
    let probes: Vec<(String, Probe)> =
        futures::future::join_all(failed.iter().map(|(ep, e)| async move {
            let p = match split_host_port(ep, None) {
                Some((host, port)) => probe(&host, port, config.tls.as_ref(), within).await,
                None => Probe::Unresolvable(ep.clone()),
            };
            debug!(endpoint = %ep, error = %e, probe = %p, "etcd endpoint unusable");
            (as_given(ep), p)
        }))
        .await;
    Err(connect_error(NAME, shown, &probes))
}

/// Checks one endpoint: a client of its own asks for the member's status before `deadline`.
/// Returns the member's id and its cluster's. Without the user: a status needs no authentication, and each
/// authentication costs the server a bcrypt check (about 200 ms of its CPU); the client the
/// connect makes next authenticates, and says whether the credentials are right. (With them
/// here, each `fencelock` process authenticated once per endpoint more: black-box round 7 saw
/// 18 waiters starting together on a loaded 2-core machine lose their sessions to it.)
async fn check(endpoint: &str, config: &EtcdConfig, deadline: Instant) -> Result<(u64, u64)> {
    let unauthenticated = EtcdConfig {
        user: None,
        ..config.clone()
    };
    // An answer that is an error of no other kind (a protocol error, an unknown method): not
    // an etcd member at that address but another service (an HTTP server, Redis), a setting
    // to fix. It was an internal failure ("h2 protocol error"), the CLI's 70.
    // (An error etcd itself gives, `etcdserver: …`, stays as it is: "not capable" while the
    // cluster's version is undecided, say.)
    let not_etcd = |e: Error| match e {
        Error::Backend {
            temporary: false,
            ref source,
            ..
        } if !source.to_string().contains("etcdserver:") => Error::invalid_config(
            endpoint,
            "it does not answer as an etcd member (another service at that address?)",
        ),
        other => other,
    };
    // Each attempt on a client (a connection) of its own: one left unanswered is joined by
    // another (see `hedged`).
    let probe = || async {
        let mut c = Client::connect([endpoint], Some(options(&unauthenticated)))
            .await
            .map_err(|e| not_etcd(map("connect", e)))?;
        let status = c.status().await.map_err(|e| not_etcd(map("connect", e)))?;
        Ok(status
            .header()
            .map_or((0, 0), |h| (h.member_id(), h.cluster_id())))
    };
    // A port where nothing listens is said at once, beside the status asked: etcd-client's
    // channel waits for a connection until the deadline, and a refused port read as a silent
    // member after the whole connect timeout ("no session within the connect timeout"), where
    // ZooKeeper and Redis say "connection refused" (black-box round 37, L3). The status is
    // still waited for otherwise: a host that drops the connection attempt is a silent one.
    // Looked at only once the status is late: on a TLS port the bare connection is logged by
    // the member as a failed handshake, noise at every connect of every process.
    let refused = async {
        // (With TLS the status takes more round trips: a second, not to connect beside every
        // member's answer on a slow link.)
        let after = if config.tls.is_some() {
            REFUSED_AFTER_TLS
        } else {
            REFUSED_AFTER
        };
        tokio::time::sleep(after).await;
        let refused = match split_host_port(endpoint, None) {
            // (A connection made is closed at once.)
            Some((host, port)) => matches!(
                tokio::net::TcpStream::connect((host.as_str(), port)).await,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
            ),
            None => false,
        };
        if !refused {
            std::future::pending::<()>().await;
        }
    };
    let answered = tokio::select! {
        answered = hedged(deadline, || timeout_at(deadline, probe())) => answered,
        () = refused => {
            return Err(Error::Connect {
                backend: NAME,
                endpoints: endpoint.to_string(),
                temporary: true,
                source: Probe::Refused.to_string().into(),
            })
        }
    };
    match answered {
        Ok(r) => r,
        Err(_) => Err(Error::Connect {
            backend: NAME,
            endpoints: endpoint.to_string(),
            temporary: true,
            source: "no answer within the connect timeout".into(),
        }),
    }
}

/// How long [`check`] waits for a member's status before it looks whether the port is
/// refused.
const REFUSED_AFTER: Duration = Duration::from_millis(100);

/// [`REFUSED_AFTER`] with TLS.
const REFUSED_AFTER_TLS: Duration = Duration::from_secs(1);

/// Keeps the client's rotation to the members that answer, for as long as the backend lives:
/// every [`CHECK_EVERY`] each endpoint is asked for its status, with [`CHECK_TIMEOUT`] to
/// answer. One that misses [`MISSES_TO_REMOVE`] checks in a row (a member down, or hung: a
/// `SIGSTOP`ped or stalled process still accepts connections, and requests sent there wait
/// until their timeout) is taken out of the rotation — never the last one — and one that
/// answers again is put back (also one a session's stream took out: see [`Rotation`]).
/// Requests already sent to a hung member still wait for their bound; new ones, and the
/// heartbeat's next try, go to the others.
pub(crate) async fn monitor(client: Weak<Client>, config: EtcdConfig, rotation: Arc<Rotation>) {
    // The endpoints as the client knows them (with their scheme), the form the rotation has too.
    let Ok(endpoints) = config.validate() else {
        return;
    };
    if endpoints.len() < 2 {
        return;
    }
    // One probe client per endpoint, made again after a failure. Without credentials: a
    // status needs no permission, and any answer but "unavailable" or a timeout counts.
    let mut probes: Vec<Option<Client>> = endpoints.iter().map(|_| None).collect();
    // Nor asking for a leader: during an election every member would refuse, and the check
    // is whether the member answers at all.
    let options = options(&EtcdConfig {
        user: None,
        ..config.clone()
    })
    .with_require_leader(false)
    .with_timeout(CHECK_TIMEOUT);
    // Consecutive missed checks per endpoint: one miss is not enough to take it out.
    let mut misses = vec![0u32; endpoints.len()];
    // Endpoints found answering for another cluster, said once each.
    let mut foreign = vec![false; endpoints.len()];
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        if client.strong_count() == 0 {
            return;
        }
        let checks = endpoints
            .iter()
            .zip(probes.iter_mut())
            .zip(foreign.iter_mut())
            .map(|((ep, probe), foreign)| {
            let options = options.clone();
            let rotation = &rotation;
            async move {
                let answered = tokio::time::timeout(CHECK_TIMEOUT, async {
                    if probe.is_none() {
                        *probe = Some(Client::connect([ep.as_str()], Some(options)).await?);
                    }
                    let c = probe.as_mut().expect("a probe client");
                    c.status().await
                })
                .await;
                match answered {
                    // A member of another cluster (an endpoint that answered late at the
                    // connect, so not refused there): out, as one that does not answer, and
                    // said, since processes that connected while this cluster was slow are
                    // on the other one.
                    Ok(Ok(status))
                        if status
                            .header()
                            .is_some_and(|h| h.cluster_id() != rotation.cluster) =>
                    {
                        if !std::mem::replace(foreign, true) {
                            tracing::error!(
                                endpoint = %ep,
                                "this etcd endpoint answers for another cluster than the one connected to: list one cluster's endpoints"
                            );
                        }
                        false
                    }
                    Ok(Ok(status)) => {
                        if let Some(h) = status.header() {
                            rotation.learned(ep, h.member_id()).await;
                        }
                        true
                    }
                    // The member answered, if only to refuse (say, credentials): it is up. Not
                    // another service at the address, which answers too (a protocol error, an
                    // unknown method): left out at the connect, it must stay out.
                    Ok(Err(etcd_client::Error::GRpcStatus(s)))
                        if s.message().starts_with("etcdserver:")
                            || matches!(
                                s.code(),
                                tonic::Code::Unauthenticated
                                    | tonic::Code::PermissionDenied
                                    | tonic::Code::InvalidArgument
                            ) =>
                    {
                        true
                    }
                    _ => {
                        *probe = None;
                        false
                    }
                }
            }
        });
        let answered = futures::future::join_all(checks).await;
        let Some(client) = client.upgrade() else {
            return;
        };
        // A round where most members fail (the host itself stalled, say) takes nobody out: the
        // rotation would churn for nothing.
        let failing = answered.iter().filter(|up| !**up).count();
        let may_remove = failing * 2 <= endpoints.len();
        for ((ep, up), missed) in endpoints.iter().zip(answered).zip(misses.iter_mut()) {
            *missed = if up { 0 } else { missed.saturating_add(1) };
            if up {
                rotation.put_back(&client, ep).await;
            } else if may_remove
                && *missed >= MISSES_TO_REMOVE
                && rotation.take_out(&client, ep).await
            {
                info!(endpoint = %ep, "etcd endpoint does not answer: out of the rotation");
            }
        }
    }
}
