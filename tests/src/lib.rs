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

/// A free TCP port on 127.0.0.1 (bound once and released), for a server started next.
///
/// Picked at random below the kernel's ephemeral range (32768–60999 by default), never twice
/// in one process: a port the kernel hands out for `bind(0)` is also what it hands to the next
/// outgoing connection of any process, and the suites run side by side open thousands of
/// connections. A ZooKeeper server that lost its port to one exited at its start (CI run 40).
pub fn free_port() -> u16 {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let port = fastrand::u16(20_000..32_000);
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    // Crowded: let the kernel choose.
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The README's Rust snippets, compiled (and run where they can) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// A server that hangs: a loopback listener that accepts every connection and never reads or
/// answers (a stopped or wedged process whose kernel still completes TCP handshakes). Stops
/// accepting, and drops what it took, when dropped.
#[derive(Debug)]
pub struct HungServer {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl HungServer {
    /// Listens on a free loopback port (in a Tokio runtime).
    pub async fn start() -> HungServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("its address");
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        HungServer { addr, task }
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for HungServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
