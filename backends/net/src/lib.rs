//! # fencelock-net
//!
//! Pieces shared by fencelock's network backends (`fencelock-etcd`, `fencelock-zookeeper`):
//! the TLS settings ([`TlsConfig`], re-exported by both), and the diagnosis of an endpoint that
//! cannot be used ([`probe`]), which turns "it did not connect" into a typed error with its
//! cause: a name that does not resolve, a refused or unreachable port, a server certificate
//! from an unknown authority, a client certificate the server rejected, a plaintext client at a
//! TLS port or the reverse. Whether the error is temporary follows from the cause. And
//! connection attempts hedged in time ([`hedged`]): one left unanswered is joined by another.
//! And waits that look again at their own entry now and then ([`unless_own_vanishes`]).
//!
//! An implementation detail of the backends: use it through them.
#![forbid(unsafe_code)]

mod hedge;
mod probe;
mod recheck;
mod redact;
mod tls;

use std::sync::Arc;

pub use hedge::{hedged, FIRST_HEDGE};
pub use probe::{certificate_failure, connect_error, probe, split_host_port, Probe};
pub use recheck::{recheck_every, unless_own_vanishes};
pub use redact::{masked_port_note, redact};
pub use tls::TlsConfig;

/// The one crypto provider of every TLS connection fencelock makes (the client libraries'
/// too): aws-lc-rs, so that no second provider makes rustls' process default ambiguous.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}
