//! Connecting to an etcd cluster: every endpoint is checked on its own first, and the client
//! talks only to those that answered.
//!
//! etcd-client balances requests over every endpoint it is given, and a member that refuses
//! connections stays in its rotation: with one of two members down, about half of all requests
//! would fail. So each endpoint is asked for its status (which needs no permission) through a
//! client of its own; the client is then built over the healthy ones, and the others are added
//! back by a background task once they answer. When no endpoint answers, each is diagnosed
//! (name, port, TLS) so that the error says why and is temporary only if waiting can help.

use std::sync::Weak;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use fencelock::backend::Backoff;
use fencelock::{Error, Result};
use fencelock_net::{connect_error, probe, split_host_port, Probe};
use tokio::time::{timeout_at, Instant};
use tracing::{debug, info};

use crate::config::EtcdConfig;
use crate::error::{map, NAME};

/// How often an endpoint left out at connect time is checked again.
const REJOIN_EVERY: Duration = Duration::from_secs(5);

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

/// Connects as `config` says, within its connect timeout; returns the client and the
/// endpoints left out (unhealthy now).
pub(crate) async fn connect(config: &EtcdConfig) -> Result<(Client, Vec<String>)> {
    let endpoints = config.validate()?;
    let shown = config.endpoints.join(",");
    let deadline = Instant::now() + config.connect_timeout;
    let mut backoff = Backoff::new();
    loop {
        let checks = endpoints.iter().map(|ep| check(ep, config, deadline));
        let results = futures::future::join_all(checks).await;
        let mut healthy = Vec::new();
        let mut failed = Vec::new();
        for (ep, r) in endpoints.iter().zip(results) {
            match r {
                Ok(()) => healthy.push(ep.clone()),
                // Credentials, permissions, configuration: the same everywhere, and final.
                Err(e) if !e.is_temporary() && !matches!(e, Error::Connect { .. }) => {
                    return Err(e)
                }
                Err(e) => failed.push((ep.clone(), e)),
            }
        }
        if !healthy.is_empty() {
            let left_out: Vec<String> = failed.into_iter().map(|(ep, _)| ep).collect();
            if !left_out.is_empty() {
                info!(
                    ?left_out,
                    "etcd endpoints not answering: connecting without them for now"
                );
            }
            let client = Client::connect(&healthy, Some(options(config)))
                .await
                .map_err(|e| map("connect", e))?;
            return Ok((client, left_out));
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
                (ep.clone(), p)
            }))
            .await;
        if probes.iter().any(|(_, p)| p.is_permanent()) || Instant::now() >= deadline {
            return Err(connect_error(NAME, &shown, &probes));
        }
        let pause = backoff.next_delay();
        if Instant::now() + pause >= deadline {
            return Err(connect_error(NAME, &shown, &probes));
        }
        tokio::time::sleep(pause).await;
    }
}

/// Checks one endpoint: a client of its own, authenticated if a user is set, asks for the
/// member's status (no permission needed) before `deadline`.
async fn check(endpoint: &str, config: &EtcdConfig, deadline: Instant) -> Result<()> {
    let probe = async {
        let mut c = Client::connect([endpoint], Some(options(config)))
            .await
            .map_err(|e| map("connect", e))?;
        c.status().await.map_err(|e| map("connect", e))?;
        Ok(())
    };
    match timeout_at(deadline, probe).await {
        Ok(r) => r,
        Err(_) => Err(Error::Connect {
            backend: NAME,
            endpoints: endpoint.to_string(),
            temporary: true,
            source: "no answer within the connect timeout".into(),
        }),
    }
}

/// Adds the endpoints left out at connect time back to `client` once each answers, checking
/// every few seconds; ends when they all rejoined or the backend is gone.
pub(crate) async fn rejoin(client: Weak<Client>, config: EtcdConfig, mut left_out: Vec<String>) {
    while !left_out.is_empty() {
        tokio::time::sleep(REJOIN_EVERY).await;
        let Some(client) = client.upgrade() else {
            return;
        };
        let mut still = Vec::new();
        for ep in left_out {
            let deadline = Instant::now() + config.connect_timeout;
            if check(&ep, &config, deadline).await.is_ok() {
                match client.add_endpoint(ep.as_str()).await {
                    Ok(()) => info!(endpoint = %ep, "etcd endpoint answers again: added"),
                    Err(e) => {
                        debug!(endpoint = %ep, error = %e, "cannot add the endpoint back");
                        still.push(ep);
                    }
                }
            } else {
                still.push(ep);
            }
        }
        left_out = still;
    }
}
