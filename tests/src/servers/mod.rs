//! Real servers for the tests, started from the binaries of Debian's packages on free loopback
//! ports with temporary data dirs, as clusters of any size (a single server is a one-member
//! cluster), and stopped by PID when dropped.
//!
//! One skip policy for every kind ([`available`]): a missing server skips the tests with a
//! message, except in CI (`CI=true`), where it is a failure. One way to share a server between
//! the tests of a binary ([`shared`]): started by the first test that asks, stopped when the
//! last one holding it finishes.

pub mod etcd;
pub mod fourlw;
pub mod postgres;
pub mod redis;
pub mod redis_cluster;
pub mod redis_sentinel;
pub mod zookeeper;

use std::sync::{Arc, Mutex, Weak};

use crate::in_ci;
use crate::target::{Kind, Target};

/// A running cluster that tests can disturb: its members killed, restarted, paused.
#[async_trait::async_trait]
pub trait Cluster: Send + Sync {
    /// Which backend it serves.
    fn kind(&self) -> Kind;

    /// How many members it has.
    fn size(&self) -> usize;

    /// Member `i`'s client address, `127.0.0.1:PORT`.
    fn endpoint(&self, i: usize) -> String;

    /// Every member's client address.
    fn endpoints(&self) -> Vec<String> {
        (0..self.size()).map(|i| self.endpoint(i)).collect()
    }

    /// Where clients connect: every member, comma-separated.
    fn target(&self) -> Target {
        Target::new(self.kind(), self.endpoints().join(","))
    }

    /// The index of the current leader (bounded wait for one; a single server leads).
    async fn leader(&self) -> usize;

    /// Waits (bounded) until every running member has applied what the leader had committed
    /// when called: a member resumed from a pause is behind, and a fault injected before it
    /// caught up is two faults (the cluster may then need seconds to elect a leader). By
    /// default, once a leader is known.
    async fn caught_up(&self) {
        self.leader().await;
    }

    /// SIGKILLs member `i`.
    fn kill(&self, i: usize);

    /// Restarts a killed member `i` on its data dir, and waits (bounded) until it listens.
    fn restart(&self, i: usize);

    /// Pauses (SIGSTOP) member `i`.
    fn pause(&self, i: usize);

    /// Resumes (SIGCONT) member `i`.
    fn resume(&self, i: usize);

    /// Everything the cluster knows under `namespace`, for a failing test's message.
    async fn dump(&self, namespace: &str) -> String;

    /// The member that session `id` (as `Session::id()` shows it) is connected to, where the
    /// cluster can tell (ZooKeeper: from each server's connections); `None` elsewhere.
    async fn member_of(&self, _id: &str) -> Option<usize> {
        None
    }
}

/// TLS on a server's client port (etcd's members, a Redis server).
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server certificate (PEM).
    pub cert: std::path::PathBuf,
    /// Its key (PEM).
    pub key: std::path::PathBuf,
    /// With a CA, clients must present a certificate it signed (etcd `--client-cert-auth`,
    /// Redis `tls-auth-clients yes`).
    pub client_ca: Option<std::path::PathBuf>,
}

/// The free space `/dev/shm` needs for the servers' data directories to go there.
const SHM_ROOM: u64 = 512 << 20;

/// A temporary data directory for a server named by `prefix`, in memory (`/dev/shm`) where
/// the machine has it: a server's fsyncs then cost nothing, so a shared disk's stalls (another
/// job writing gigabytes) cannot pass for the faults the tests inject. Removed on drop.
pub fn data_dir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    let mut b = tempfile::Builder::new();
    b.prefix(prefix);
    let shm = std::path::Path::new("/dev/shm");
    // Only with room to spare: a container's /dev/shm is often 64 MiB, and an etcd member
    // preallocates a 64 MB write-ahead log (the second member of a cluster would fail).
    let room = rustix::fs::statvfs(shm)
        .map(|v| v.f_bavail.saturating_mul(v.f_frsize))
        .unwrap_or(0);
    if shm.is_dir() && room >= SHM_ROOM {
        if let Ok(dir) = b.tempdir_in(shm) {
            return Ok(dir);
        }
    }
    b.tempdir()
}

/// Whether the servers of `kind` are installed. Without them: panics in CI, else prints a skip
/// message and returns `false`.
pub fn available(kind: Kind) -> bool {
    present(match kind {
        Kind::Etcd => etcd::missing(),
        Kind::ZooKeeper => zookeeper::missing(),
        Kind::Redis => redis::missing(),
    })
}

/// The skip policy for a server that is `missing` (what is missing, if anything): panics in
/// CI, else prints a skip message and returns `false`.
pub fn present(missing: Option<String>) -> bool {
    let Some(missing) = missing else {
        return true;
    };
    if in_ci() {
        panic!("{missing}: required in CI");
    }
    eprintln!("skipped: {missing}");
    false
}

/// The server of `slot` shared by the tests of one binary: `start`ed by the first that asks,
/// stopped when the last one holding it drops it. `None` (after a skip message) if the server
/// of `kind` is not installed outside CI.
pub fn shared<C>(
    slot: &'static Mutex<Weak<C>>,
    kind: Kind,
    start: impl FnOnce() -> C,
) -> Option<Arc<C>> {
    if !available(kind) {
        return None;
    }
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(server) = slot.upgrade() {
        return Some(server);
    }
    let server = Arc::new(start());
    *slot = Arc::downgrade(&server);
    Some(server)
}
