//! Test harnesses of fencelock: real etcd and ZooKeeper clusters started from the binaries of
//! Debian's packages on loopback ports with temporary data dirs, the conformance factories over
//! them, a TCP proxy, the shared fault tests and their bookkeeping, the adversity suite, and Apache
//! Curator from Java. The benchmark, which uses them, is a package of its own (`bench/`), so that
//! the integration tests do not build it.

pub mod adversity;
pub mod curator;
pub mod errors;
pub mod example;
pub mod faults;
pub mod guarded;
pub mod holder;
pub mod load;
pub mod notifications;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod servers;
pub mod stamps;
pub mod target;

/// Whether we run in CI (`CI=true`), where a missing server is a failure, never a skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A free TCP port on 127.0.0.1 (bound once and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The README's Rust snippets, compiled (and run where they can) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
