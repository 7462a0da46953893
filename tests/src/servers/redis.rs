//! Redis servers for the tests: Debian's `redis-server` on free loopback ports with temporary
//! data dirs, alone or as a replica of another, stopped (by PID) when dropped.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fencelock::backend::Backend;
use fencelock::conformance::Factory;
use fencelock::Result;
use fencelock_redis::RedisBackend;

use super::ServerTls;
use crate::pki::TestPki;
use crate::process::ManagedChild;

/// What is missing to run Redis, if anything.
pub fn missing() -> Option<String> {
    let found = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (!found).then(|| "redis-server is not installed (Debian package `redis-server`)".into())
}

/// Whether Redis can run: panics in CI if not, else prints a skip message.
pub fn available() -> bool {
    super::present(missing())
}

/// How a server keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// No persistence at all (a restart starts empty).
    None,
    /// `appendonly yes`, `appendfsync always`: no acknowledged write is lost.
    FsyncAlways,
}

/// A running `redis-server`; killed (by PID) when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Mutex<ManagedChild>,
    port: u16,
    dir: tempfile::TempDir,
    durability: Durability,
    /// TLS only (no plaintext port), with `redis-cli` talking TLS to it.
    tls: Option<CliTls>,
    /// A node of a Redis Cluster (`cluster-enabled yes`), with its cluster bus port.
    cluster: Option<u16>,
}

/// What `redis-cli` needs to talk to a TLS-only server.
#[derive(Debug, Clone)]
struct CliTls {
    server: ServerTls,
    /// The CA that signed the server's certificate.
    ca: PathBuf,
    /// A client certificate and key the server accepts.
    client: (PathBuf, PathBuf),
}

impl RedisServer {
    /// Starts a server and waits (bounded) until it answers. Blocking.
    pub fn start(durability: Durability) -> RedisServer {
        let dir = super::data_dir("fencelock-redis-").expect("temp dir");
        let port = crate::free_port();
        let child = spawn(port, &dir, durability, None, None, None);
        let server = RedisServer {
            child: Mutex::new(child),
            port,
            dir,
            durability,
            tls: None,
            cluster: None,
        };
        server.wait_ready();
        server
    }

    /// Starts a node of a Redis Cluster (no slots, not yet met with the others). Blocking.
    pub fn start_cluster_node() -> RedisServer {
        let dir = super::data_dir("fencelock-redis-").expect("temp dir");
        let (port, bus) = (crate::free_port(), crate::free_port());
        let child = spawn(port, &dir, Durability::None, None, None, Some(bus));
        let server = RedisServer {
            child: Mutex::new(child),
            port,
            dir,
            durability: Durability::None,
            tls: None,
            cluster: Some(bus),
        };
        server.wait_ready();
        server
    }

    /// Starts a server that speaks TLS only (`tls-port`, no plaintext port) with the server
    /// certificate of `pki`, requiring a client certificate signed by its CA if `mutual`, and
    /// an ACL user `app` (password `app-pw`) allowed everything. Blocking.
    pub fn start_tls(pki: &TestPki, mutual: bool) -> RedisServer {
        Self::start_tls_with(pki, mutual, None)
    }

    /// Like [`start_tls`](Self::start_tls), and, with `primary`, a replica of the TLS-only
    /// server on that port (replicating over TLS, trusting `pki`'s CA). Blocking.
    pub fn start_tls_with(pki: &TestPki, mutual: bool, primary: Option<u16>) -> RedisServer {
        Self::start_tls_node(pki, mutual, primary, None)
    }

    /// Starts a node of a Redis Cluster that speaks TLS only, on the cluster bus too, with
    /// the ACL user of [`start_tls`](Self::start_tls). Blocking.
    pub fn start_cluster_node_tls(pki: &TestPki) -> RedisServer {
        Self::start_tls_node(pki, false, None, Some(crate::free_port()))
    }

    fn start_tls_node(
        pki: &TestPki,
        mutual: bool,
        primary: Option<u16>,
        cluster: Option<u16>,
    ) -> RedisServer {
        let (server, client) = (pki.server(), pki.client());
        let tls = CliTls {
            server: ServerTls {
                cert: server.cert,
                key: server.key,
                client_ca: Some(pki.ca()).filter(|_| mutual),
            },
            ca: pki.ca(),
            client: (client.cert, client.key),
        };
        let dir = super::data_dir("fencelock-redis-").expect("temp dir");
        let port = crate::free_port();
        let child = spawn(port, &dir, Durability::None, primary, Some(&tls), cluster);
        let server = RedisServer {
            child: Mutex::new(child),
            port,
            dir,
            durability: Durability::None,
            tls: Some(tls),
            cluster,
        };
        server.wait_ready();
        // On replicas too: ACL users are each server's own, not replicated.
        let setuser = [
            "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all",
        ];
        assert_eq!(server.cli(&setuser).unwrap().trim(), "OK");
        server
    }

    /// Starts a replica of `primary` (asynchronous replication, as Redis does by default),
    /// keeping its data as `durability` says.
    pub fn replica_of(primary: &RedisServer) -> RedisServer {
        Self::replica_with(primary, Durability::None)
    }

    /// A replica of `primary` that keeps its data as `durability` says.
    pub fn replica_with(primary: &RedisServer, durability: Durability) -> RedisServer {
        Self::replica_via(primary.port, durability)
    }

    /// A replica of the primary at `127.0.0.1:port` (the primary itself, or a proxy in front
    /// of it through which the tests can cut the replication link).
    pub fn replica_via(port: u16, durability: Durability) -> RedisServer {
        let dir = super::data_dir("fencelock-redis-").expect("temp dir");
        let own = crate::free_port();
        let child = spawn(own, &dir, durability, Some(port), None, None);
        let server = RedisServer {
            child: Mutex::new(child),
            port: own,
            dir,
            durability,
            tls: None,
            cluster: None,
        };
        server.wait_ready();
        server
    }

    /// Waits (bounded, blocking) until this replica's link to its primary is up and it has
    /// loaded the primary's data.
    pub fn wait_in_sync(&self) {
        let start = Instant::now();
        while !self
            .cli(&["INFO", "replication"])
            .unwrap_or_default()
            .contains("master_link_status:up")
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the replica did not sync: {}",
                self.child().log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_ready(&self) {
        let start = Instant::now();
        loop {
            if let Ok(out) = self.cli(&["PING"]) {
                if out.trim() == "PONG" {
                    return;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "redis-server did not answer within 30 s: {}",
                self.child().log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn child(&self) -> std::sync::MutexGuard<'_, ManagedChild> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a command through `redis-cli` (blocking) and returns its output; at most 30 s (a
    /// paused server never answers: the output is then empty).
    pub fn cli(&self, args: &[&str]) -> std::io::Result<String> {
        let mut cmd = Command::new("timeout");
        cmd.args([
            "30",
            "redis-cli",
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
        ]);
        if let Some(tls) = &self.tls {
            cmd.arg("--tls")
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client.0)
                .arg("--key")
                .arg(&tls.client.1);
        }
        let out = cmd.args(args).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Writes, as fencelock's scripts would, an exclusive entry of session `sid` with token 1
    /// at the head of queue `queue`, and gives the session's key `ttl_ms` to live (blocking):
    /// another process's entry, and a killed one's once that runs out. Returns the entry's
    /// name, `{queue}/{sid}`.
    pub fn write_entry(&self, queue: &str, sid: &str, ttl_ms: u64) -> String {
        let entry = format!("{queue}/{sid}");
        let session = format!("fencelock:s:{sid}");
        let run = |args: &[&str]| assert_ne!(self.cli(args).unwrap().trim(), "", "{args:?}");
        run(&["HSET", &session, "v", "1", &entry, "1"]);
        run(&["PEXPIRE", &session, &ttl_ms.to_string()]);
        let fields = [
            ("q", queue),
            ("t", "1"),
            ("s", sid),
            ("k", "x"),
            ("c", "0"),
            ("v", ""),
        ];
        let mut hset = vec!["HSET".to_string(), format!("fencelock:e:{entry}")];
        hset.extend(
            fields
                .iter()
                .flat_map(|(f, v)| [f.to_string(), v.to_string()]),
        );
        run(&hset.iter().map(String::as_str).collect::<Vec<_>>());
        run(&["ZADD", &format!("fencelock:q:{queue}"), "1", &entry]);
        entry
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILLs the server.
    pub fn kill(&self) {
        self.child().kill();
    }

    /// Restarts a killed server on its data dir (what it persisted), as a primary.
    pub fn restart(&self) {
        self.restart_as(None);
    }

    /// Restarts a killed server on its data dir, as a replica of the server on port `primary`
    /// if given (it then resynchronizes from it), else as a primary.
    pub fn restart_as(&self, primary: Option<u16>) {
        let child = spawn(
            self.port,
            &self.dir,
            self.durability,
            primary,
            self.tls.as_ref(),
            self.cluster,
        );
        *self.child() = child;
        self.wait_ready();
    }

    /// Pauses the server (SIGSTOP).
    pub fn pause(&self) {
        self.child().pause();
    }

    /// Resumes the server (SIGCONT).
    pub fn resume(&self) {
        self.child().resume();
    }

    /// Promotes a replica: `REPLICAOF NO ONE`.
    pub fn promote(&self) {
        let out = self.cli(&["REPLICAOF", "NO", "ONE"]).expect("redis-cli");
        assert_eq!(out.trim(), "OK", "REPLICAOF NO ONE: {out}");
    }

    /// A backend connected to this server.
    pub async fn backend(&self) -> RedisBackend {
        RedisBackend::connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to redis at {}: {e:?}", self.url()))
    }
}

fn spawn(
    port: u16,
    dir: &tempfile::TempDir,
    durability: Durability,
    primary: Option<u16>,
    tls: Option<&CliTls>,
    cluster: Option<u16>,
) -> ManagedChild {
    let mut cmd = Command::new("redis-server");
    match tls {
        None => cmd.args(["--port", &port.to_string()]),
        Some(cli) => {
            let tls = &cli.server;
            // Replication (and Sentinel's connections) over TLS too, trusting the test CA.
            cmd.args(["--tls-replication", "yes"])
                .arg("--tls-ca-cert-file")
                .arg(&cli.ca);
            cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key);
            match &tls.client_ca {
                Some(_) => cmd.args(["--tls-auth-clients", "yes"]),
                None => cmd.args(["--tls-auth-clients", "no"]),
            }
        }
    };
    cmd.args(["--bind", "127.0.0.1"])
        .args(["--save", "", "--daemonize", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir.path());
    match durability {
        Durability::None => cmd.args(["--appendonly", "no"]),
        Durability::FsyncAlways => cmd.args(["--appendonly", "yes", "--appendfsync", "always"]),
    };
    if let Some(p) = primary {
        cmd.args(["--replicaof", "127.0.0.1", &p.to_string()]);
    }
    // A full resynchronisation starts at once (Redis 7 waits 5 s by default for more replicas
    // to share it): after a failover the other replica resyncs from the new primary, and no
    // write waiting for a replica's acknowledgement (a session's heartbeat with
    // `wait_for_replicas`) succeeds meanwhile. A clean-clone CI run lost a holder's session
    // at TTL 20 s that way, the failover done in 2.2 s.
    cmd.args(["--repl-diskless-sync-delay", "0"]);
    if let (Some(_), Some(_)) = (cluster, tls) {
        cmd.args(["--tls-cluster", "yes"]);
    }
    if let Some(bus) = cluster {
        // A node that misses pings for a second is failed over (the tests' faults).
        cmd.args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ])
        .args(["--cluster-node-timeout", "1000"])
        // The other shards go on serving while one fails over (by default the whole
        // cluster answers CLUSTERDOWN until every slot has a primary again).
        .args(["--cluster-require-full-coverage", "no"])
        .args(["--cluster-port", &bus.to_string()]);
    }
    ManagedChild::spawn(format!("redis-{port}"), cmd, &dir.path().join("redis.log"))
        .expect("start redis-server")
}

/// A primary and its replica behind one address (a proxy, as a virtual IP or a Sentinel-aware
/// client would be), for the adversity suite. Killing the primary fails over the way an
/// operator or Sentinel does: the replica is promoted (`REPLICAOF NO ONE`) and the address
/// moves to it. Replication is asynchronous and goes through a proxy: the link is cut
/// (black-holed) for [`RedisPair::lag`] before the primary dies, so that the failover loses the
/// primary's last writes, as a lagging or partitioned replica does.
#[derive(Debug)]
pub struct RedisPair {
    members: [RedisServer; 2],
    primary: std::sync::atomic::AtomicUsize,
    front: crate::proxy::Proxy,
    /// The replication link of the first replica.
    link: crate::proxy::Proxy,
    /// How far the replica lags behind when the primary dies.
    pub lag: Duration,
}

impl RedisPair {
    /// Starts a primary (AOF, `appendfsync always`), its replica (likewise, once promoted) and
    /// the proxy in front.
    pub async fn start(lag: Duration) -> RedisPair {
        let primary = tokio::task::spawn_blocking(|| RedisServer::start(Durability::FsyncAlways))
            .await
            .expect("start redis");
        let link = crate::proxy::Proxy::start(&primary.addr()).await;
        let link_port = link.port();
        let replica = tokio::task::spawn_blocking(move || {
            let r = RedisServer::replica_via(link_port, Durability::FsyncAlways);
            r.wait_in_sync();
            r
        })
        .await
        .expect("start the replica");
        let front = crate::proxy::Proxy::start(&primary.addr()).await;
        RedisPair {
            members: [primary, replica],
            primary: std::sync::atomic::AtomicUsize::new(0),
            front,
            link,
            lag,
        }
    }

    fn primary(&self) -> usize {
        self.primary.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl crate::servers::Cluster for RedisPair {
    fn kind(&self) -> crate::target::Kind {
        crate::target::Kind::Redis
    }

    fn size(&self) -> usize {
        2
    }

    fn endpoint(&self, i: usize) -> String {
        self.members[i].addr()
    }

    /// Clients connect to the front proxy, which follows the primary.
    fn target(&self) -> crate::target::Target {
        crate::target::Target::new(crate::target::Kind::Redis, self.front.addr())
    }

    /// The current primary.
    async fn leader(&self) -> usize {
        self.primary()
    }

    /// Killing the primary fails over to the replica (after letting it lag); killing the
    /// replica only kills it.
    fn kill(&self, i: usize) {
        let p = self.primary();
        if i != p {
            self.members[i].kill();
            return;
        }
        let r = 1 - p;
        if self.members[r]
            .cli(&["PING"])
            .map_or(true, |o| o.trim() != "PONG")
        {
            // No replica to fail over to.
            self.members[p].kill();
            return;
        }
        tokio::task::block_in_place(|| {
            self.link.set(crate::proxy::Mode::BlackHole);
            std::thread::sleep(self.lag);
            self.members[p].kill();
            self.members[r].promote();
        });
        self.primary.store(r, std::sync::atomic::Ordering::SeqCst);
        self.front.retarget(&self.members[r].addr());
    }

    /// Restarts member `i` as a replica of the primary (or as the primary, if the primary is
    /// down too: a whole-cluster restart).
    fn restart(&self, i: usize) {
        let p = self.primary();
        tokio::task::block_in_place(|| {
            if i == p
                || self.members[p]
                    .cli(&["PING"])
                    .map_or(true, |o| o.trim() != "PONG")
            {
                self.members[i].restart_as(None);
                self.primary.store(i, std::sync::atomic::Ordering::SeqCst);
                self.front.retarget(&self.members[i].addr());
            } else {
                self.members[i].restart_as(Some(self.members[p].port()));
            }
        });
    }

    fn pause(&self, i: usize) {
        self.members[i].pause();
    }

    fn resume(&self, i: usize) {
        self.members[i].resume();
    }

    async fn dump(&self, namespace: &str) -> String {
        let p = self.primary();
        self.members[p]
            .cli(&["--scan", "--pattern", &format!("fencelock:*{namespace}*")])
            .unwrap_or_default()
    }
}

static SHARED: Mutex<Weak<RedisServer>> = Mutex::new(Weak::new());

/// The server shared by the tests of one binary; `None` if Redis is missing outside CI.
pub fn shared() -> Option<Arc<RedisServer>> {
    super::shared(&SHARED, crate::target::Kind::Redis, || {
        RedisServer::start(Durability::None)
    })
}

/// The conformance factory over a Redis server.
#[derive(Debug, Clone)]
pub struct RedisFactory {
    backend: RedisBackend,
    /// Keeps the server running while the test runs.
    pub server: Arc<RedisServer>,
}

impl RedisFactory {
    /// A factory over the shared server; `None` if Redis is missing outside CI.
    pub async fn shared() -> Option<RedisFactory> {
        let server = shared()?;
        Some(RedisFactory {
            backend: server.backend().await,
            server,
        })
    }

    /// The connected backend.
    pub fn redis(&self) -> &RedisBackend {
        &self.backend
    }
}

/// What an operator runs to delete an entry by hand: the entry's hash (`KEYS[1]`, under its
/// layout's prefix), its place in the queue, and the messages that wake whoever waits on it.
const ADMIN_DELETE: &str = r#"
local P = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1] - 3)
local path = redis.call('HGET', KEYS[1], 'q')
if not path then return 0 end
redis.call('ZREM', P .. ':q:' .. path, ARGV[1])
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', 'fencelock:c:' .. ARGV[1], 'gone')
redis.call('PUBLISH', 'fencelock:h:' .. path, 'gone')
return 1
"#;

/// The conformance factories' reach under the layout, on one server (`prefix` gives
/// `fencelock` for every name) or a cluster (`fencelock{G}`, the name's group).
pub(crate) struct Layout<'a> {
    pub(crate) backend: &'a RedisBackend,
    pub(crate) prefix: fn(&str) -> String,
}

impl Layout<'_> {
    /// Deletes entry `key` as an operator would ([`ADMIN_DELETE`]).
    pub(crate) async fn delete_as_admin(&self, key: &str) -> Result<()> {
        let mut con = self.backend.connection();
        redis::Script::new(ADMIN_DELETE)
            .key(format!("{}:e:{key}", (self.prefix)(key)))
            .arg(key)
            .invoke_async::<i64>(&mut con)
            .await
            .map(drop)
            .map_err(|e| fencelock::Error::backend("redis", "admin delete", false, e))
    }

    /// Entry hashes of the live session under names no fencelock name gives (an empty
    /// segment; no queue above it), with the session's key in their groups (on a cluster a
    /// session has keys only in the groups it used; a live one is left as it is), and a key
    /// under the entries' prefix that is no hash (left out of the listing, so not counted),
    /// all expiring in a minute.
    pub(crate) async fn write_foreign_keys(&self, namespace: &str, session: &str) -> Result<usize> {
        let map =
            |e: redis::RedisError| fencelock::Error::backend("redis", "foreign write", false, e);
        let mut con = self.backend.connection();
        let counted = [
            format!("{namespace}/jobs//{session}"),
            format!("{namespace}/loose"),
        ];
        for name in &counted {
            let prefix = (self.prefix)(name);
            let key = format!("{prefix}:e:{name}");
            let skey = format!("{prefix}:s:{session}");
            // A member of the queue its hash names, and a field of its session's key, as an
            // entry is (out of its queue, an entry is no live one, nor on a cluster one its
            // session does not own, and is not listed at all).
            let queue = format!("{prefix}:q:{namespace}");
            redis::pipe()
                .hset_multiple(
                    &key,
                    &[("q", namespace), ("t", "1"), ("s", session), ("k", "x")],
                )
                .pexpire(&key, 60_000)
                .zadd(&queue, name, 1)
                .pexpire(&queue, 60_000)
                .cmd("HSETNX")
                .arg(&skey)
                .arg("v")
                .arg(0)
                .hset(&skey, name, "1")
                .cmd("PEXPIRE")
                .arg(&skey)
                .arg(60_000)
                .arg("NX")
                .query_async::<()>(&mut con)
                .await
                .map_err(map)?;
        }
        let plain = format!("{namespace}/plain/string");
        redis::pipe()
            .set_ex(
                format!("{}:e:{plain}", (self.prefix)(&plain)),
                "foreign",
                60,
            )
            .query_async::<()>(&mut con)
            .await
            .map_err(map)?;
        Ok(counted.len())
    }
}

#[async_trait::async_trait]
impl Factory for RedisFactory {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_millis(1500)
    }

    async fn delete_as_admin(&self, key: &str) -> Result<()> {
        self.layout().delete_as_admin(key).await
    }

    async fn write_foreign_keys(&self, namespace: &str, session: &str) -> Result<usize> {
        self.layout().write_foreign_keys(namespace, session).await
    }
}

impl RedisFactory {
    fn layout(&self) -> Layout<'_> {
        Layout {
            backend: &self.backend,
            prefix: |_| fencelock_redis::layout::KEY_PREFIX.to_string(),
        }
    }
}
