//! ZooKeeper ensembles from Debian's `zookeeper` package (jars in `/usr/share/java`, needs
//! Java), one client, quorum and election port per server; and the conformance [`Factory`]
//! over one. A one-server ensemble runs standalone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fencelock::backend::Backend;
use fencelock::conformance::Factory;
use fencelock::Result;
use fencelock_zookeeper::ZooKeeperBackend;

use super::{fourlw, Cluster};
use crate::free_port;
use crate::process::ManagedChild;
use crate::target::Kind;

/// The servers' tick: sessions may last from 2 ticks (1 s) up to [`MAX_SESSION_TIMEOUT`].
pub const TICK: Duration = Duration::from_millis(500);

/// The smallest session timeout the test servers grant (2 × [`TICK`]).
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(1000);

/// The largest session timeout the test servers grant.
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a server may take to answer `ruok`, and an ensemble to elect a leader.
const START_TIMEOUT: Duration = Duration::from_secs(60);

const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// A logging backend for slf4j (ZooKeeper logs through it); the server runs without one too.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// The main class of a server (standalone when the config names no peers).
const MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

/// `java` from `JAVA_HOME`, else `/usr/bin/java`.
pub fn java() -> Option<PathBuf> {
    let candidates = std::env::var_os("JAVA_HOME")
        .map(|h| PathBuf::from(h).join("bin/java"))
        .into_iter()
        .chain([PathBuf::from("/usr/bin/java")]);
    candidates.into_iter().find(|p| p.exists())
}

/// What is missing to run ZooKeeper, if anything.
pub fn missing() -> Option<String> {
    (!(Path::new(ZOOKEEPER_JAR).exists() && java().is_some()))
        .then(|| "ZooKeeper is not installed (Debian packages `zookeeper` and a JRE)".to_string())
}

/// TLS on the client port of an ensemble's servers (ZooKeeper's `secureClientPort`, with the
/// Netty connection factory).
#[derive(Debug, Clone)]
pub struct ZkServerTls {
    /// The server certificate followed by its PKCS#8 key, in one PEM file.
    pub keystore: std::path::PathBuf,
    /// The CA that signs client certificates (and that clients trust).
    pub ca: std::path::PathBuf,
    /// Whether clients must present a certificate (`ssl.clientAuth=need`).
    pub client_auth: bool,
}

/// How to start an ensemble.
#[derive(Debug, Clone, Default)]
pub struct ZkOptions {
    /// Serve clients over TLS only (a plaintext port stays open for the harness's
    /// four-letter words, and no test connects clients to it).
    pub tls: Option<ZkServerTls>,
    /// With users, every session must authenticate by SASL DIGEST-MD5 as one of them.
    pub sasl_users: Vec<(String, String)>,
    /// The server's heap limit in MiB (default 256: enough for the tests). A server holding
    /// hundreds of thousands of nodes needs more: at 256 it spends its time in full
    /// collections and stops answering for longer than a session's TTL.
    pub heap_mib: Option<u32>,
    /// Servers (by index) whose `maxSessionTimeout` is lower than the others' (an ensemble
    /// configured unevenly, as during a rolling change of its settings).
    pub max_session_timeouts: Vec<(usize, Duration)>,
}

/// The jars ZooKeeper's Netty connection factory needs beyond what `zookeeper.jar` pulls in.
const NETTY_JARS: &[&str] = &[
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
    "/usr/share/java/netty-transport-native-unix-common.jar",
];

struct Server {
    /// `myid`, 1-based.
    id: usize,
    client_port: u16,
    /// The TLS client port, if the ensemble serves TLS.
    secure_port: Option<u16>,
    quorum_port: u16,
    election_port: u16,
    child: Option<ManagedChild>,
}

/// A ZooKeeper ensemble (tickTime 500 ms: sessions from 1 s; admin server off; every
/// four-letter-word command enabled).
pub struct ZkEnsemble {
    servers: Mutex<Vec<Server>>,
    java: PathBuf,
    dir: tempfile::TempDir,
    options: ZkOptions,
}

impl std::fmt::Debug for ZkEnsemble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkEnsemble")
            .field("endpoints", &self.endpoints())
            .finish()
    }
}

impl ZkEnsemble {
    /// Starts `size` servers and waits (bounded) until each answers and one leads (or the one
    /// server serves). Panics if the ensemble cannot start.
    pub fn start(size: usize) -> ZkEnsemble {
        Self::start_with(size, ZkOptions::default())
    }

    /// Starts `size` servers with `options` (see [`start`](Self::start)).
    pub fn start_with(size: usize, options: ZkOptions) -> ZkEnsemble {
        let mut last = String::new();
        // Ports picked free may be taken before the servers bind them: try a few times.
        for _ in 0..3 {
            match Self::try_start(size, &options) {
                Ok(e) => return e,
                Err(err) => last = err,
            }
        }
        panic!("cannot start a ZooKeeper ensemble of {size}: {last}");
    }

    fn try_start(size: usize, options: &ZkOptions) -> Result<ZkEnsemble, String> {
        let java = java().ok_or("java not found")?;
        let dir = super::data_dir("fencelock-zk-").map_err(|e| format!("temp dir: {e}"))?;
        let servers: Vec<Server> = (0..size)
            .map(|i| Server {
                id: i + 1,
                client_port: free_port(),
                secure_port: options.tls.as_ref().map(|_| free_port()),
                quorum_port: free_port(),
                election_port: free_port(),
                child: None,
            })
            .collect();
        let peers: String = if size > 1 {
            servers
                .iter()
                .map(|s| {
                    format!(
                        "server.{}=127.0.0.1:{}:{}\n",
                        s.id, s.quorum_port, s.election_port
                    )
                })
                .collect()
        } else {
            String::new()
        };
        for s in &servers {
            let home = dir.path().join(format!("s{}", s.id));
            let data = home.join("data");
            std::fs::create_dir_all(&data).map_err(|e| format!("data dir: {e}"))?;
            std::fs::write(data.join("myid"), format!("{}\n", s.id))
                .map_err(|e| format!("myid: {e}"))?;
            let mut extra = String::new();
            if let (Some(tls), Some(port)) = (&options.tls, s.secure_port) {
                extra.push_str(&format!(
                    "secureClientPortAddress=127.0.0.1\n\
                     secureClientPort={port}\n\
                     serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                     ssl.keyStore.location={keystore}\n\
                     ssl.keyStore.type=PEM\n\
                     ssl.trustStore.location={ca}\n\
                     ssl.trustStore.type=PEM\n\
                     ssl.clientAuth={auth}\n",
                    keystore = tls.keystore.display(),
                    ca = tls.ca.display(),
                    auth = if tls.client_auth { "need" } else { "none" },
                ));
            }
            if !options.sasl_users.is_empty() {
                let users: String = options
                    .sasl_users
                    .iter()
                    .map(|(u, p)| format!("    user_{u}=\"{p}\"\n"))
                    .collect();
                std::fs::write(
                    home.join("jaas.conf"),
                    format!(
                        "Server {{\n    org.apache.zookeeper.server.auth.DigestLoginModule required\n{users};\n}};\n"
                    ),
                )
                .map_err(|e| format!("jaas.conf: {e}"))?;
                extra.push_str(
                    "authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n\
                     sessionRequireClientSASLAuth=true\n",
                );
            }
            std::fs::write(
                home.join("zoo.cfg"),
                format!(
                    "tickTime={tick}\n\
                     initLimit=10\n\
                     syncLimit=5\n\
                     minSessionTimeout={min}\n\
                     maxSessionTimeout={max}\n\
                     dataDir={data}\n\
                     clientPort={port}\n\
                     clientPortAddress=127.0.0.1\n\
                     maxClientCnxns=0\n\
                     admin.enableServer=false\n\
                     4lw.commands.whitelist=*\n\
                     {extra}\
                     {peers}",
                    tick = TICK.as_millis(),
                    min = MIN_SESSION_TIMEOUT.as_millis(),
                    max = options
                        .max_session_timeouts
                        .iter()
                        .find(|(i, _)| *i + 1 == s.id)
                        .map_or(MAX_SESSION_TIMEOUT, |(_, max)| *max)
                        .as_millis(),
                    data = data.display(),
                    port = s.client_port,
                ),
            )
            .map_err(|e| format!("zoo.cfg: {e}"))?;
        }
        let e = ZkEnsemble {
            servers: Mutex::new(servers),
            java,
            dir,
            options: options.clone(),
        };
        for i in 0..size {
            e.spawn(i)?;
        }
        for i in 0..size {
            e.wait_up(i)?;
        }
        let start = Instant::now();
        while !(0..size).any(|i| serves_as_leader(&fourlw::ask(e.port(i), "srvr"))) {
            if start.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "no leader within {START_TIMEOUT:?}: {}",
                    e.log_tail(0)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(e)
    }

    fn home(&self, i: usize) -> PathBuf {
        let id = self.servers.lock().unwrap()[i].id;
        self.dir.path().join(format!("s{id}"))
    }

    /// The client port of server `i` (also its four-letter-word port).
    pub fn port(&self, i: usize) -> u16 {
        self.servers.lock().unwrap()[i].client_port
    }

    fn spawn(&self, i: usize) -> Result<(), String> {
        let home = self.home(i);
        let jaas = (!self.options.sasl_users.is_empty()).then(|| home.join("jaas.conf"));
        let mut cmd = server_command(
            &self.java,
            self.options.tls.is_some(),
            jaas.as_deref(),
            self.options.heap_mib.unwrap_or(256),
        );
        cmd.arg(home.join("zoo.cfg"));
        let child = ManagedChild::spawn(
            format!("zookeeper {}", i + 1),
            cmd,
            &home.join("zookeeper.log"),
        )
        .map_err(|e| format!("spawn java: {e}"))?;
        self.servers.lock().unwrap()[i].child = Some(child);
        Ok(())
    }

    /// Waits (bounded) until server `i` answers `ruok` (it may not serve yet: that needs a
    /// quorum) and, with TLS, listens on its secure port too (opened separately, sometimes
    /// later: a TLS test once found nothing listening there).
    fn wait_up(&self, i: usize) -> Result<(), String> {
        let start = Instant::now();
        loop {
            // Bound first: the guard of an `if let` scrutinee lives through its block, and
            // `log_tail` locks the servers again (a server that exited at its start once hung
            // a CI run here).
            let exited = self.servers.lock().unwrap()[i]
                .child
                .as_mut()
                .and_then(ManagedChild::try_wait);
            if let Some(status) = exited {
                return Err(format!(
                    "server {i} exited ({status}): {}",
                    self.log_tail(i)
                ));
            }
            let secure = self.servers.lock().unwrap()[i].secure_port;
            if fourlw::ask(self.port(i), "ruok").as_deref() == Some("imok")
                && secure.is_none_or(|p| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok())
            {
                return Ok(());
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "server {i} did not answer within {START_TIMEOUT:?}: {}",
                    self.log_tail(i)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The tail of server `i`'s log, for failure messages.
    pub fn log_tail(&self, i: usize) -> String {
        crate::process::log_tail(&self.home(i).join("zookeeper.log"), 20)
    }

    /// Sends a four-letter-word command to server `i`; its answer, if any (blocking).
    pub fn four_letter(&self, i: usize, cmd: &str) -> Option<String> {
        fourlw::ask(self.port(i), cmd)
    }

    /// The connect string: every server's client address, comma-separated.
    pub fn connect_string(&self) -> String {
        self.endpoints().join(",")
    }

    /// The process id of server `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.servers.lock().unwrap()[i]
            .child
            .as_ref()
            .and_then(ManagedChild::pid)
    }
}

#[async_trait::async_trait]
impl Cluster for ZkEnsemble {
    /// From each live server's `cons`: the one listing the session (bounded wait).
    async fn member_of(&self, id: &str) -> Option<usize> {
        let sid = format!("sid=0x{id}");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            for i in 0..self.size() {
                let live = self.servers.lock().unwrap()[i]
                    .child
                    .as_ref()
                    .is_some_and(|c| !c.is_paused());
                if live
                    && fourlw::ask_async(self.port(i), "cons")
                        .await
                        .is_some_and(|c| c.contains(&sid))
                {
                    return Some(i);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    fn kind(&self) -> Kind {
        Kind::ZooKeeper
    }

    fn size(&self) -> usize {
        self.servers.lock().unwrap().len()
    }

    /// The client port (the TLS one when the ensemble serves TLS).
    fn endpoint(&self, i: usize) -> String {
        let s = &self.servers.lock().unwrap()[i];
        format!("127.0.0.1:{}", s.secure_port.unwrap_or(s.client_port))
    }

    /// Asks every live server with `srvr` for its mode (bounded wait for one that leads).
    async fn leader(&self) -> usize {
        let start = Instant::now();
        loop {
            for i in 0..self.size() {
                let live = self.servers.lock().unwrap()[i]
                    .child
                    .as_ref()
                    .is_some_and(|c| !c.is_paused());
                if live && serves_as_leader(&fourlw::ask_async(self.port(i), "srvr").await) {
                    return i;
                }
            }
            if start.elapsed() >= START_TIMEOUT {
                let mut seen = String::new();
                for i in 0..self.size() {
                    let mode = fourlw::ask_async(self.port(i), "srvr").await;
                    let mode = mode
                        .as_deref()
                        .and_then(|m| m.lines().find(|l| l.starts_with("Mode")));
                    seen.push_str(&format!("\nserver {i}: {mode:?}\n{}", self.log_tail(i)));
                }
                panic!("no ZooKeeper leader within {START_TIMEOUT:?}:{seen}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn kill(&self, i: usize) {
        if let Some(mut c) = self.servers.lock().unwrap()[i].child.take() {
            c.kill();
        }
    }

    fn restart(&self, i: usize) {
        assert!(
            self.servers.lock().unwrap()[i].child.is_none(),
            "server {i} is running"
        );
        if let Err(e) = self.spawn(i).and_then(|()| self.wait_up(i)) {
            panic!("cannot restart ZooKeeper server {i}: {e}");
        }
    }

    fn pause(&self, i: usize) {
        if let Some(c) = self.servers.lock().unwrap()[i].child.as_mut() {
            c.pause();
        }
    }

    fn resume(&self, i: usize) {
        if let Some(c) = self.servers.lock().unwrap()[i].child.as_mut() {
            c.resume();
        }
    }

    /// The sessions and watches of every server (`cons`, `wchc`).
    async fn dump(&self, namespace: &str) -> String {
        let mut out = format!("(namespace {namespace})\n");
        for i in 0..self.size() {
            for cmd in ["cons", "wchc"] {
                let answer = fourlw::ask_async(self.port(i), cmd).await;
                out.push_str(&format!(
                    "server {i} {cmd}:\n{}\n",
                    answer.unwrap_or_default()
                ));
            }
        }
        out
    }
}

/// Whether a `srvr` answer says the server leads (or serves alone).
fn serves_as_leader(srvr: &Option<String>) -> bool {
    srvr.as_deref().is_some_and(|a| {
        a.lines()
            .any(|l| matches!(l.trim(), "Mode: leader" | "Mode: standalone"))
    })
}

/// The `java` command line of a ZooKeeper server from Debian's jars, up to the main class (the
/// caller appends the config file): a heap of `heap_mib`, quick start, admin server off, log level from
/// `ZK_TEST_LOG_LEVEL` (default `warn`).
fn server_command(java: &Path, netty: bool, jaas: Option<&Path>, heap_mib: u32) -> Command {
    let mut classpath = ZOOKEEPER_JAR.to_string();
    let extra: &[&str] = if netty { NETTY_JARS } else { &[] };
    for jar in extra.iter().chain([&SLF4J_SIMPLE_JAR]) {
        if Path::new(jar).exists() {
            classpath.push(':');
            classpath.push_str(jar);
        }
    }
    let level = std::env::var("ZK_TEST_LOG_LEVEL").unwrap_or_else(|_| "warn".into());
    let mut cmd = Command::new(java);
    cmd.arg(format!("-Xmx{heap_mib}m"));
    cmd.args([
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Dzookeeper.admin.enableServer=false",
        "-Dzookeeper.jmx.log4j.disable=true",
        // Reap empty CONTAINER parents quickly (default: every minute).
        "-Dznode.container.checkIntervalMs=1000",
        // An election whose notifications were lost (a member restarted or paused under
        // load) sends them again within 5 s, not after a back-off of up to a minute: a CI run
        // found no leader for 60 s after the adversity suite's restarts, on a loaded machine.
        "-Dzookeeper.fastleader.maxNotificationInterval=5000",
        &format!("-Dorg.slf4j.simpleLogger.defaultLogLevel={level}"),
    ]);
    if let Some(jaas) = jaas {
        cmd.arg(format!(
            "-Djava.security.auth.login.config={}",
            jaas.display()
        ));
    }
    cmd.args(["-cp", &classpath, MAIN]);
    cmd
}

static SHARED: Mutex<Weak<ZkEnsemble>> = Mutex::new(Weak::new());

/// The one-server ensemble shared by the tests of one binary (see [`super::shared`]).
pub fn shared() -> Option<Arc<ZkEnsemble>> {
    super::shared(&SHARED, Kind::ZooKeeper, || ZkEnsemble::start(1))
}

/// The conformance [`Factory`] over a ZooKeeper ensemble.
#[derive(Debug, Clone)]
pub struct ZkFactory {
    ensemble: Arc<ZkEnsemble>,
    backend: ZooKeeperBackend,
}

impl ZkFactory {
    /// A factory over the [`shared`] server, or `None` if ZooKeeper is not installed (outside
    /// CI). The backend accepts TTLs down to the server's minimum.
    pub async fn shared() -> Option<ZkFactory> {
        Some(Self::over(shared()?).await)
    }

    /// A factory over `ensemble`.
    pub async fn over(ensemble: Arc<ZkEnsemble>) -> ZkFactory {
        let backend = ZooKeeperBackend::builder(ensemble.connect_string())
            .min_ttl(MIN_SESSION_TIMEOUT)
            .connect()
            .await
            .expect("connect to the test ZooKeeper");
        ZkFactory { ensemble, backend }
    }

    /// The ensemble under test.
    pub fn server(&self) -> &Arc<ZkEnsemble> {
        &self.ensemble
    }

    /// The backend under test.
    pub fn zookeeper(&self) -> &ZooKeeperBackend {
        &self.backend
    }

    /// A session of the backend under test in `namespace`, with the suite's usual TTL.
    pub async fn session(&self, namespace: &str) -> fencelock::Session {
        fencelock::Session::builder(self.backend.clone())
            .namespace(namespace)
            .ttl(fencelock::conformance::TTL)
            .start()
            .await
            .expect("session")
    }

    /// A plain client of the ensemble, outside fencelock.
    pub async fn raw(&self) -> zookeeper_client::Client {
        zookeeper_client::Client::connect(&self.ensemble.connect_string())
            .await
            .expect("raw client")
    }
}

#[async_trait::async_trait]
impl Factory for ZkFactory {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn delete_as_admin(&self, key: &str) -> Result<()> {
        let client = zookeeper_client::Client::connect(&self.ensemble.connect_string())
            .await
            .map_err(|e| fencelock::Error::backend("zookeeper", "admin connect", true, e))?;
        client
            .delete(key, None)
            .await
            .map_err(|e| fencelock::Error::backend("zookeeper", "admin delete", false, e))
    }

    /// Persistent nodes another client could make: an entry-shaped node right under the
    /// namespace (no queue above it), a lock entry under a name ending `.proclaimed` (reserved),
    /// one under a segment longer than a name may be, and a node this client may not read
    /// (digest ACL of another user: left out of the listing, so not counted).
    async fn write_foreign_keys(&self, namespace: &str, _session: &str) -> Result<usize> {
        use zookeeper_client as zk;
        let map = |e: zk::Error| fencelock::Error::backend("zookeeper", "foreign create", false, e);
        let client = self.raw().await;
        let root = format!("/{}", namespace.trim_start_matches('/'));
        let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let long = "n".repeat(700);
        let counted = [
            format!("{root}/lock-0000000005"),
            format!("{root}/x.proclaimed/_c_0f-lock-0000000001"),
            format!("{root}/{long}/_c_0f-lock-0000000001"),
        ];
        for path in &counted {
            client.mkdir(path, &open).await.map_err(map)?;
        }
        let other = [zk::Acl::new(
            zk::Permission::ALL,
            zk::AuthId::new("digest", "someone-else:bm90LWEtcmVhbC1kaWdlc3Q="),
        )];
        let closed = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&other));
        client
            .create(&format!("{root}/private"), b"", &closed)
            .await
            .map_err(map)?;
        Ok(counted.len())
    }
}
