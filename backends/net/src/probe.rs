//! Diagnosing an endpoint that a client library could not use, and the typed error for a set of
//! such endpoints.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{BoxError, Error};
use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;
use tokio::net::{lookup_host, TcpStream};
use tokio::time::timeout;
use tokio_rustls::TlsConnector;

use crate::tls::{any_server_config, TlsConfig};

/// How long a probe waits, after a TLS handshake completed, for the server to reject the
/// client's certificate (TLS 1.3 servers check it only after the client's side is done).
const REJECTION_WAIT: Duration = Duration::from_millis(300);

/// What a probe of one endpoint found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Probe {
    /// The endpoint answers as configured (TCP, and the TLS handshake when TLS is set).
    Reachable,
    /// The host name does not resolve.
    Unresolvable(String),
    /// Nothing listens on the port.
    Refused,
    /// The host cannot be reached (no route, reset).
    Unreachable(String),
    /// No answer within the time given.
    TimedOut,
    /// The endpoint speaks TLS, but the client is set up for plaintext.
    SpeaksTls,
    /// TLS is set up, but the endpoint does not complete a TLS handshake.
    NotTls(String),
    /// The server's certificate is not trusted: an unknown authority, another name, expired.
    ServerCertificate(String),
    /// The server rejected the client's certificate, or wanted one the client did not present.
    ClientCertificate(String),
}

impl Probe {
    /// Whether the cause is a wrong setting (retrying cannot help) rather than a server that
    /// is down.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Probe::Unresolvable(_)
                | Probe::SpeaksTls
                | Probe::NotTls(_)
                | Probe::ServerCertificate(_)
                | Probe::ClientCertificate(_)
        )
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Shown when a connect failed all the same: the server took the connection and
            // then did not answer (hung, or not the server the URL names).
            Probe::Reachable => f.write_str("the connection opens, but no answer came"),
            Probe::Unresolvable(e) => write!(f, "the host name does not resolve ({e})"),
            Probe::Refused => f.write_str("connection refused (nothing listens on the port)"),
            Probe::Unreachable(e) => write!(f, "unreachable ({e})"),
            Probe::TimedOut => f.write_str("no answer in time"),
            Probe::SpeaksTls => {
                f.write_str("the endpoint speaks TLS, but no TLS is configured (set a CA)")
            }
            Probe::NotTls(e) => write!(
                f,
                "TLS is configured, but the endpoint does not speak TLS ({e})"
            ),
            Probe::ServerCertificate(e) => {
                write!(f, "the server's certificate is not trusted ({e})")
            }
            Probe::ClientCertificate(e) => {
                write!(f, "the server rejected the client certificate ({e})")
            }
        }
    }
}

/// Splits an endpoint (`host:port`, with an optional scheme such as `http://`, `https://`,
/// `tcp://` or `tcp+tls://`, and an optional path) into its host and port; `None` if it has
/// no valid port (port 0 is none: nothing can be reached there). `[v6]:port` is understood.
pub fn split_host_port(endpoint: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    split(endpoint, default_port).filter(|(_, port)| *port != 0)
}

/// [`split_host_port`] with port 0 accepted (`redact` reads with it what is a port).
pub(crate) fn split(endpoint: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let rest = rest.split('/').next().unwrap_or(rest);
    if let Some(v6) = rest.strip_prefix('[') {
        let (host, tail) = v6.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if tail.is_empty() => default_port?,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match rest.rsplit_once(':') {
        // An IPv6 address must be bracketed: `::1` or `fe80::1` read as host and port would
        // be a host nobody typed.
        Some((host, _)) if host.contains(':') => None,
        Some((host, port)) if !host.is_empty() => Some((host.to_string(), port.parse().ok()?)),
        Some(_) => None,
        None if !rest.is_empty() => Some((rest.to_string(), default_port?)),
        None => None,
    }
}

/// Probes `host:port`: resolves it, connects, and completes a TLS handshake with `tls` (then
/// waits a moment for a rejection of the client certificate), or, without TLS, checks that the
/// port does not speak TLS. Each step is bounded by `within`.
pub async fn probe(host: &str, port: u16, tls: Option<&TlsConfig>, within: Duration) -> Probe {
    let addrs: Vec<_> = match timeout(within, lookup_host((host, port))).await {
        Err(_) => return Probe::TimedOut,
        Ok(Err(e)) => return Probe::Unresolvable(e.to_string()),
        Ok(Ok(addrs)) => addrs.collect(),
    };
    if addrs.is_empty() {
        return Probe::Unresolvable("no address".into());
    }
    let tcp = match timeout(within, TcpStream::connect(&addrs[..])).await {
        Err(_) => return Probe::TimedOut,
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => return Probe::Refused,
        Ok(Err(e)) => return Probe::Unreachable(e.to_string()),
        Ok(Ok(s)) => s,
    };
    match tls {
        Some(tls) => probe_tls(host, tcp, tls, within).await,
        None => probe_plaintext(host, tcp, within).await,
    }
}

async fn probe_tls(host: &str, tcp: TcpStream, tls: &TlsConfig, within: Duration) -> Probe {
    let config = match tls.client_config() {
        Ok(c) => c,
        Err(e) => return Probe::ClientCertificate(e.to_string()),
    };
    let name = tls.server_name().unwrap_or(host).to_string();
    let Ok(name) = ServerName::try_from(name.clone()) else {
        return Probe::ServerCertificate(format!("{name:?} is not a valid server name"));
    };
    let connector = TlsConnector::from(Arc::new(config));
    let mut stream = match timeout(within, connector.connect(name, tcp)).await {
        // No evidence either way: a hung or stalled server completes nothing, while a
        // plaintext etcd or ZooKeeper server closes or resets the connection on the greeting
        // (read below as `NotTls`).
        Err(_) => return Probe::TimedOut,
        Ok(Err(e)) => return tls_failure(&e),
        Ok(Ok(s)) => s,
    };
    let mut byte = [0u8; 1];
    match timeout(within.min(REJECTION_WAIT), stream.read(&mut byte)).await {
        Ok(Err(e)) => match tls_failure(&e) {
            Probe::NotTls(_) => Probe::Reachable,
            other => other,
        },
        Ok(Ok(0)) if tls.identity_pem().is_none() => Probe::ClientCertificate(
            "the server closed the connection after the handshake: it may require a client certificate".into(),
        ),
        _ => Probe::Reachable,
    }
}

/// The certificate failure of a TLS handshake somewhere in `e`'s chain of causes (an
/// `io::Error` carrying a `rustls::Error`, as `tokio-rustls` reports one, possibly wrapped in an
/// `Arc`, as a client library may keep it): the server's certificate not trusted
/// ([`Probe::ServerCertificate`]) or ours refused ([`Probe::ClientCertificate`]). `None` for
/// anything else. For clients that report such a failure as a plain I/O error.
pub fn certificate_failure(e: &(dyn std::error::Error + 'static)) -> Option<Probe> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        let io = err.downcast_ref::<io::Error>().or_else(|| {
            err.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>()
                .and_then(|a| (**a).downcast_ref::<io::Error>())
        });
        if let Some(found) = io
            .map(tls_failure)
            .filter(|p| matches!(p, Probe::ServerCertificate(_) | Probe::ClientCertificate(_)))
        {
            return Some(found);
        }
        cur = err.source();
    }
    None
}

/// What a failed TLS handshake or read says.
fn tls_failure(e: &io::Error) -> Probe {
    let Some(tls) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return Probe::NotTls(e.to_string());
    };
    match tls {
        rustls::Error::InvalidCertificate(c) => Probe::ServerCertificate(format!("{c:?}")),
        rustls::Error::AlertReceived(alert) => Probe::ClientCertificate(format!("{alert:?}")),
        rustls::Error::NoCertificatesPresented => {
            Probe::ServerCertificate("the server presented no certificate".into())
        }
        other => Probe::NotTls(other.to_string()),
    }
}

async fn probe_plaintext(host: &str, tcp: TcpStream, within: Duration) -> Probe {
    // Only a TLS server completes a handshake, even one that accepts any certificate, or
    // answers it with a TLS alert (one that requires a client certificate); a plaintext server
    // drops or ignores the greeting. Nothing is sent after the handshake.
    let name = ServerName::try_from(host.to_string())
        .unwrap_or_else(|_| ServerName::try_from("probe.invalid").expect("a valid name"));
    let connector = TlsConnector::from(Arc::new(any_server_config()));
    match timeout(
        within.min(Duration::from_secs(1)),
        connector.connect(name, tcp),
    )
    .await
    {
        Ok(Ok(_)) => Probe::SpeaksTls,
        Ok(Err(e)) if matches!(tls_failure(&e), Probe::ClientCertificate(_)) => Probe::SpeaksTls,
        _ => Probe::Reachable,
    }
}

/// The error for endpoints none of which could be used, from what their probes found: a wrong
/// setting wins (a permanent error), else the cluster is unreachable (temporary).
pub fn connect_error(backend: &'static str, endpoints: &str, probes: &[(String, Probe)]) -> Error {
    let found = |pick: fn(&Probe) -> bool| probes.iter().find(|(_, p)| pick(p));
    let because = |ep: &str, p: &Probe| -> BoxError { format!("{ep}: {p}").into() };
    if let Some((ep, p)) = found(|p| matches!(p, Probe::ClientCertificate(_))) {
        return Error::Unauthenticated {
            backend,
            source: because(ep, p),
        };
    }
    if let Some((ep, p)) = found(|p| matches!(p, Probe::SpeaksTls | Probe::NotTls(_))) {
        return Error::invalid_config(ep, p.to_string());
    }
    // One endpoint, the one the error names already (maybe with a scheme, `tcp://A`): said
    // once ("cannot connect to A: A: …" read as a stutter).
    let bare = |s: &'_ str| {
        let s = s.split_once("://").map_or(s, |(_, rest)| rest);
        s.replace(['[', ']'], "")
    };
    let all: Vec<String> = match probes {
        [(ep, p)] if bare(ep) == bare(endpoints) => vec![p.to_string()],
        _ => probes.iter().map(|(ep, p)| format!("{ep}: {p}")).collect(),
    };
    let permanent = found(|p| matches!(p, Probe::ServerCertificate(_))).is_some()
        || (!probes.is_empty()
            && probes
                .iter()
                .all(|(_, p)| matches!(p, Probe::Unresolvable(_))));
    Error::Connect {
        backend,
        endpoints: endpoints.to_string(),
        temporary: !permanent,
        source: all.join("; ").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let hp = |h: &str, p| Some((h.to_string(), p));
        assert_eq!(
            split_host_port("127.0.0.1:2379", None),
            hp("127.0.0.1", 2379)
        );
        assert_eq!(
            split_host_port("https://etcd-1:2379", None),
            hp("etcd-1", 2379)
        );
        assert_eq!(
            split_host_port("tcp+tls://zk:2281/chroot", None),
            hp("zk", 2281)
        );
        assert_eq!(split_host_port("[::1]:2181", None), hp("::1", 2181));
        assert_eq!(split_host_port("zk", Some(2181)), hp("zk", 2181));
        assert_eq!(split_host_port("zk", None), None);
        assert_eq!(split_host_port("zk:port", None), None);
        assert_eq!(split_host_port(":2181", None), None);
        assert_eq!(split_host_port("zk:0", None), None);
        assert_eq!(split_host_port("[::1]:0", None), None);
        // Unbracketed IPv6 is refused, not read as a host and a port.
        assert_eq!(split_host_port("::1", Some(2181)), None);
        assert_eq!(split_host_port("fe80::1", Some(2181)), None);
        assert_eq!(split_host_port("tcp://fe80::1:2181", None), None);
    }

    #[tokio::test]
    async fn refused_and_unresolvable() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let p = probe("127.0.0.1", port, None, Duration::from_secs(2)).await;
        assert_eq!(p, Probe::Refused);
        assert!(!p.is_permanent());
        let p = probe("no-such-host.invalid", 1, None, Duration::from_secs(5)).await;
        assert!(matches!(p, Probe::Unresolvable(_)), "{p:?}");
        let e = connect_error("etcd", "x", &[("x".into(), p)]);
        assert!(!e.is_temporary(), "{e:?}");
        let e = connect_error("etcd", "x", &[("x".into(), Probe::Refused)]);
        assert!(e.is_temporary(), "{e:?}");
        // The one endpoint the error names is not named again in its cause.
        let cause = |e: &Error| std::error::Error::source(e).map(|c| c.to_string());
        assert_eq!(cause(&e), Some(Probe::Refused.to_string()), "{e}");
        // Also when the error names it with a scheme (ZooKeeper's `tcp://`).
        let e = connect_error("zookeeper", "tcp://x", &[("x".into(), Probe::Refused)]);
        assert_eq!(cause(&e), Some(Probe::Refused.to_string()), "{e}");
        let e = connect_error(
            "zookeeper",
            "tcp://[::1]:1",
            &[("::1:1".into(), Probe::Refused)],
        );
        assert_eq!(cause(&e), Some(Probe::Refused.to_string()), "{e}");
        let two = [("x".into(), Probe::Refused), ("y".into(), Probe::Refused)];
        let e = connect_error("etcd", "x,y", &two);
        assert!(cause(&e).is_some_and(|c| c.starts_with("x: ")), "{e}");
    }

    #[tokio::test]
    async fn a_plaintext_listener_does_not_speak_tls() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 64];
                let _ = s.read(&mut buf).await; // a plaintext server reads the greeting and drops it
            }
        });
        let p = probe("127.0.0.1", port, None, Duration::from_secs(2)).await;
        assert_eq!(p, Probe::Reachable);
    }
}
