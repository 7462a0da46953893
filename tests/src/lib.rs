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
/// Picked below the kernel's ephemeral range (32768–60999 by default), never twice in one
/// process: a port the kernel hands out for `bind(0)` is also what it hands to the next outgoing
/// connection of any process, and the suites run side by side open thousands of connections. A
/// ZooKeeper server that lost its port to one exited at its start (CI run 40).
///
/// And never one that another test process may give out: each process takes blocks of
/// [`PORT_BLOCK`] ports by locking a file per block in the temporary directory (the lock goes
/// with the process), and picks only inside its own blocks. Otherwise a port is free to another
/// process's probe while the server that had it is down: a ZooKeeper member killed by the
/// adversity suite could not come back on its port (CI of stop 52).
pub fn free_port() -> u16 {
    use std::collections::BTreeSet;
    use std::fs::File;
    use std::sync::Mutex;
    struct Claimed {
        /// The first port of each block this process holds, and the block's lock.
        blocks: Vec<(u16, File)>,
        given: BTreeSet<u16>,
    }
    static CLAIMED: Mutex<Claimed> = Mutex::new(Claimed {
        blocks: Vec::new(),
        given: BTreeSet::new(),
    });
    let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let candidate = claimed
            .blocks
            .iter()
            .flat_map(|(first, _)| *first..*first + PORT_BLOCK)
            .find(|p| {
                !claimed.given.contains(p) && std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok()
            });
        if let Some(port) = candidate {
            claimed.given.insert(port);
            return port;
        }
        match claim_port_block() {
            Some(block) => claimed.blocks.push(block),
            // Every block held by other processes: let the kernel choose.
            None => {
                return std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map(|a| a.port())
                    .expect("a free loopback port")
            }
        }
    }
}

/// How many ports a test process takes at a time (see [`free_port`]).
pub const PORT_BLOCK: u16 = 100;

/// Locks a block of ports that no other live process holds, trying the blocks of 20000–31999
/// from a random one; `None` if every block is held.
fn claim_port_block() -> Option<(u16, std::fs::File)> {
    const FIRST: u16 = 20_000;
    const BLOCKS: u16 = 120;
    let dir = std::env::temp_dir().join("fencelock-test-ports");
    std::fs::create_dir_all(&dir).ok()?;
    let start = fastrand::u16(0..BLOCKS);
    (0..BLOCKS).find_map(|k| {
        let first = FIRST + (start + k) % BLOCKS * PORT_BLOCK;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{first}.lock")))
            .ok()?;
        file.try_lock().ok()?;
        Some((first, file))
    })
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
