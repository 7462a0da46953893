//! Making a [`Redlock`]: its servers (each listed once) and its timing, checked.

use std::sync::Arc;

use fencelock::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::Redlock;
use crate::error::map;
use crate::redlock_timing::{RedlockTiming, MAX_RETRY_DELAY};
use crate::RedisConfig;

/// Which server an address names, for refusing one listed twice: the host (an IP address in
/// its canonical form, a name in lowercase without a trailing dot) and the port, or a Unix
/// socket's path as written. The database number is left out: two databases of one server
/// fail together. Names are not resolved, so `localhost` and `127.0.0.1` count as two.
fn server_identity(addr: &redis::ConnectionAddr) -> String {
    match addr {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            match bare.parse::<std::net::IpAddr>() {
                Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
                Ok(ip) => format!("{ip}:{port}"),
                Err(_) => format!("{}:{port}", bare.trim_end_matches('.').to_lowercase()),
            }
        }
        redis::ConnectionAddr::Unix(path) => format!("unix:{}", path.display()),
        // `ConnectionAddr` is non-exhaustive: anything else is compared as it prints.
        other => format!("{other}"),
    }
}

impl Redlock {
    /// Redlock over the servers at `urls` (`redis://host:port`), with the default timing.
    /// Connections are made on first use, so a server that is down now does not fail this.
    ///
    /// A server listed twice is refused with [`Error::InvalidConfig`]: servers are compared by
    /// host and port (IP addresses in canonical form, host names case-insensitively) or Unix
    /// socket path, whatever the database number. Names are not resolved: `localhost` and
    /// `127.0.0.1` are not recognised as one server. Called outside a Tokio runtime, it fails
    /// with [`Error::InvalidConfig`].
    pub fn connect<U: AsRef<str>>(urls: impl IntoIterator<Item = U>) -> Result<Self> {
        Self::with_timing(urls, RedlockTiming::default())
    }

    /// Redlock with explicit timing.
    pub fn with_timing<U: AsRef<str>>(
        urls: impl IntoIterator<Item = U>,
        timing: RedlockTiming,
    ) -> Result<Self> {
        let configs = urls.into_iter().map(|u| RedisConfig::new(u.as_ref()));
        Self::with_configs(configs, timing)
    }

    /// Redlock over the servers of `configs` (say, with TLS: [`RedisConfig::tls`]): each
    /// request waits at most the timing's request timeout, not the configs' own, and their
    /// `wait_for_replicas` is not used. Over TLS the first request on each connection carries
    /// its handshake: give the request timeout room for it (50 ms by default).
    pub fn with_configs(
        configs: impl IntoIterator<Item = RedisConfig>,
        timing: RedlockTiming,
    ) -> Result<Self> {
        // The connections are made lazily on the runtime's reactor: outside one, the redis
        // crate would panic here.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid_config(
                "Redlock::connect",
                "must be called inside a Tokio runtime",
            ));
        }
        // (1 ns was accepted and failed every request, as a temporary error: black-box round 39.)
        if timing.request_timeout < std::time::Duration::from_millis(1)
            || timing.request_timeout > crate::config::MAX_TIMEOUT
        {
            return Err(Error::invalid_config(
                format!("{:?}", timing.request_timeout),
                "the request timeout must be at least 1ms and at most an hour",
            ));
        }
        if !(0.0..1.0).contains(&timing.drift_factor) {
            return Err(Error::invalid_config(
                timing.drift_factor.to_string(),
                "the drift factor must be in [0, 1)",
            ));
        }
        if timing.retry_delay.is_zero() || timing.retry_delay > MAX_RETRY_DELAY {
            // Zero would retry in a hot loop (a doubled zero stays zero), without jitter.
            return Err(Error::invalid_config(
                format!("{:?}", timing.retry_delay),
                "the retry delay must be more than zero and at most a minute",
            ));
        }
        let mut servers = Vec::new();
        let mut seen = Vec::new();
        for config in configs {
            // (Its timeout only validated here: the connections below take the request
            // timeout, which Redlock bounds itself and may be under `RedisConfig`'s least.)
            let mut config = config.timeout(timing.request_timeout.max(crate::config::MIN_TIMEOUT));
            // Not used (each lock is a majority of independent servers, not a replicated
            // write), so not validated against the request timeout either.
            config.replicas = None;
            let url = config.url.as_str();
            let client = config.validate_server(
                "Redlock takes independent servers, not a Sentinel-managed primary",
            )?;
            let server = server_identity(client.get_connection_info().addr());
            if seen.contains(&server) {
                // The same server twice can never give a majority of distinct servers: each
                // attempt's second SET NX on it fails, and a lock of two such entries is never
                // granted. Two databases of one server are one failure domain too.
                return Err(Error::invalid_config(
                    crate::config::redact(url),
                    format!(
                        "Redlock needs independent servers: {server} is listed twice \
                         (compared by host and port, or socket path; names are not resolved)"
                    ),
                ));
            }
            seen.push(server);
            let manager = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timing.request_timeout))
                .set_response_timeout(Some(timing.request_timeout))
                .set_number_of_retries(0);
            let con = ConnectionManager::new_lazy_with_config(client, manager)
                .map_err(|e| map("connect", e))?;
            servers.push(con);
        }
        if servers.is_empty() {
            return Err(Error::invalid_config(
                "",
                "Redlock needs at least one server",
            ));
        }
        Ok(Redlock {
            servers: Arc::new(servers),
            timing,
        })
    }
}
