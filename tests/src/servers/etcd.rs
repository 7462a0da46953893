//! etcd clusters (the `etcd` binary of Debian's `etcd-server`), and the conformance
//! [`Factory`] over one.

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fencelock::backend::Backend;
use fencelock::conformance::Factory;
use fencelock::Result;
use fencelock_etcd::EtcdBackend;

use super::Cluster;
use crate::free_port;
use crate::process::ManagedChild;
use crate::target::Kind;

/// How long a member may take to listen after its start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the members may take to agree on a leader (ZooKeeper's harness allows as long):
/// on a loaded machine an election can fail a few times over before one member wins.
const LEADER_TIMEOUT: Duration = Duration::from_secs(60);

/// What is missing to run etcd, if anything.
pub fn missing() -> Option<String> {
    let ok = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| "etcd is not installed (Debian package `etcd-server`)".to_string())
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<ManagedChild>,
    /// Its raft id once a status named it (kept across restarts: the data dir keeps it).
    id: Option<u64>,
}

pub use super::ServerTls;

/// How to start a cluster.
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    /// Serve clients over TLS only.
    pub tls: Option<ServerTls>,
    /// The space quota (`--quota-backend-bytes`): past it, the cluster refuses writes that
    /// add data (the NOSPACE alarm).
    pub quota_bytes: Option<u64>,
}

/// An etcd cluster of one or more members on distinct loopback ports.
pub struct EtcdCluster {
    members: Mutex<Vec<Member>>,
    dir: tempfile::TempDir,
    initial: String,
    options: EtcdOptions,
}

impl std::fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("endpoints", &self.endpoints())
            .finish()
    }
}

impl EtcdCluster {
    /// Starts `size` members and waits (bounded) until each listens.
    pub fn start(size: usize) -> EtcdCluster {
        Self::start_with(size, EtcdOptions::default())
    }

    /// Starts `size` members with `options` and waits (bounded) until each listens.
    pub fn start_with(size: usize, options: EtcdOptions) -> EtcdCluster {
        let dir = super::data_dir("fencelock-etcd-").expect("temp dir");
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
                id: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let c = EtcdCluster {
            members: Mutex::new(members),
            dir,
            initial,
            options,
        };
        for i in 0..size {
            c.spawn(i);
        }
        for i in 0..size {
            c.wait_up(i);
        }
        c
    }

    fn spawn(&self, i: usize) {
        let mut members = self.members.lock().unwrap();
        let m = &mut members[i];
        let scheme = if self.options.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", &m.name, "--data-dir"])
            .arg(self.dir.path().join(&m.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", "new"])
            // Raft timing for loopback: a heartbeat every 50 ms and an election after 0.5–1 s
            // without one (etcd's defaults, 100 ms and 1–2 s, are sized for a LAN). etcd asks
            // for an election timeout of at least ten round trips between members: on loopback
            // that is microseconds, and 50 ms leaves room for a loaded machine's scheduling.
            // A killed leader then stops the cluster for about half as long, which the
            // adversity suite's kill-leader bound (the election plus our share) follows.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"]);
        if let Some(bytes) = self.options.quota_bytes {
            cmd.arg("--quota-backend-bytes").arg(bytes.to_string());
        }
        if let Some(tls) = &self.options.tls {
            cmd.arg("--cert-file").arg(&tls.cert);
            cmd.arg("--key-file").arg(&tls.key);
            if let Some(ca) = &tls.client_ca {
                cmd.arg("--client-cert-auth")
                    .arg("--trusted-ca-file")
                    .arg(ca);
            }
        }
        let log = self.dir.path().join(format!("{}.log", m.name));
        m.child =
            Some(ManagedChild::spawn(format!("etcd {}", m.name), cmd, &log).expect("start etcd"));
    }

    fn wait_up(&self, i: usize) {
        let port = self.members.lock().unwrap()[i].client_port;
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let mut members = self.members.lock().unwrap();
            let child = members[i].child.as_mut().expect("started");
            if let Some(status) = child.try_wait() {
                panic!("etcd member {i} exited ({status}): {}", child.log_tail(20));
            }
            assert!(
                start.elapsed() < START_TIMEOUT,
                "etcd member {i} did not listen within {START_TIMEOUT:?}: {}",
                child.log_tail(20)
            );
            drop(members);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Enables authentication: a `root` user (password `root-pw`), a role `{namespace}-rw`
    /// with read-write permission on the key range `{namespace}/` only, and a user `user` with
    /// password `password` holding that role. Needs a plaintext cluster.
    pub async fn enable_auth(&self, namespace: &str, user: &str, password: &str) {
        use etcd_client::Permission;
        let mut c = etcd_client::Client::connect(self.endpoints(), None)
            .await
            .expect("connect to etcd");
        let role = format!("{}-rw", namespace.replace('/', "-"));
        c.user_add("root", "root-pw", None).await.expect("add root");
        let _ = c.role_add("root").await; // built in on some versions
        c.user_grant_role("root", "root").await.expect("grant root");
        c.role_add(role.as_str()).await.expect("add role");
        let perm = Permission::read_write(format!("{namespace}/")).with_prefix();
        c.role_grant_permission(role.as_str(), perm)
            .await
            .expect("grant permission");
        c.user_add(user, password, None).await.expect("add user");
        c.user_grant_role(user, role.as_str())
            .await
            .expect("grant role");
        c.auth_enable().await.expect("enable auth");
    }

    /// The process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.lock().unwrap()[i]
            .child
            .as_ref()
            .and_then(ManagedChild::pid)
    }

    /// The last `lines` lines of member `i`'s log, or why there are none.
    fn log_tail(&self, i: usize, lines: usize) -> String {
        let name = self.members.lock().unwrap()[i].name.clone();
        crate::process::log_tail(&self.dir.path().join(format!("{name}.log")), lines)
    }

    fn running(&self, i: usize) -> bool {
        self.members.lock().unwrap()[i]
            .child
            .as_ref()
            .is_some_and(|c| !c.is_paused())
    }
}

#[async_trait::async_trait]
impl Cluster for EtcdCluster {
    fn kind(&self) -> Kind {
        Kind::Etcd
    }

    fn size(&self) -> usize {
        self.members.lock().unwrap().len()
    }

    fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members.lock().unwrap()[i].client_port)
    }

    async fn leader(&self) -> usize {
        let start = Instant::now();
        loop {
            // What each member said, for the failure message.
            let mut seen = Vec::new();
            // The leader every answering member names: a member just resumed from a pause may
            // still name the old one (or itself) until it hears the new term.
            let mut leader = None;
            let mut agreed = true;
            for i in 0..self.size() {
                if !self.running(i) {
                    seen.push(format!("member {i}: not running"));
                    continue;
                }
                let status = async {
                    let mut c = etcd_client::Client::connect([self.endpoint(i)], None).await?;
                    c.status().await
                };
                match tokio::time::timeout(Duration::from_secs(2), status).await {
                    Ok(Ok(s)) => {
                        let id = s.header().map(|h| h.member_id());
                        if id.is_some() {
                            self.members.lock().unwrap()[i].id = id;
                        }
                        seen.push(format!(
                            "member {i}: id {id:x?}, names leader {:x} in term {}, errors {:?}",
                            s.leader(),
                            s.raft_term(),
                            s.errors()
                        ));
                        match leader {
                            None => leader = Some(s.leader()),
                            Some(l) if l != s.leader() => agreed = false,
                            Some(_) => {}
                        }
                    }
                    Ok(Err(e)) => seen.push(format!("member {i}: {e}")),
                    Err(_) => seen.push(format!("member {i}: no status within 2 s")),
                }
            }
            // The member named, found by its id, which may be from an earlier round: a busy
            // leader on a loaded machine may not return its own status this round.
            let known = |l: u64| {
                (0..self.size())
                    .find(|&i| self.running(i) && self.members.lock().unwrap()[i].id == Some(l))
            };
            if let Some(i) = leader.filter(|l| agreed && *l != 0).and_then(known) {
                return i;
            }
            if start.elapsed() >= LEADER_TIMEOUT {
                let logs: String = (0..self.size())
                    .map(|i| format!("\n--- member {i}'s log:\n{}", self.log_tail(i, 15)))
                    .collect();
                panic!(
                    "no etcd leader within {LEADER_TIMEOUT:?}: {}{logs}",
                    seen.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn caught_up(&self) {
        let leader = self.leader().await;
        let status = |i: usize| async move {
            let c = etcd_client::Client::connect([self.endpoint(i)], None);
            tokio::time::timeout(Duration::from_secs(2), async { c.await?.status().await })
                .await
                .ok()
                .and_then(|r| r.ok())
        };
        let start = Instant::now();
        let Some(target) = status(leader).await.map(|s| s.raft_index()) else {
            return;
        };
        for i in (0..self.size()).filter(|i| self.running(*i)) {
            loop {
                if status(i)
                    .await
                    .is_some_and(|s| s.raft_applied_index() >= target)
                {
                    break;
                }
                assert!(
                    start.elapsed() < START_TIMEOUT,
                    "etcd member {i} did not catch up"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    fn kill(&self, i: usize) {
        if let Some(mut c) = self.members.lock().unwrap()[i].child.take() {
            c.kill();
        }
    }

    fn restart(&self, i: usize) {
        assert!(
            self.members.lock().unwrap()[i].child.is_none(),
            "member {i} is running"
        );
        self.spawn(i);
        self.wait_up(i);
    }

    fn pause(&self, i: usize) {
        if let Some(c) = self.members.lock().unwrap()[i].child.as_mut() {
            c.pause();
        }
    }

    fn resume(&self, i: usize) {
        if let Some(c) = self.members.lock().unwrap()[i].child.as_mut() {
            c.resume();
        }
    }

    /// Every event under `namespace` from revision 1 (compaction permitting).
    async fn dump(&self, namespace: &str) -> String {
        let eps = self.endpoints();
        let Ok(mut c) = etcd_client::Client::connect(eps, None).await else {
            return "(cannot connect)".into();
        };
        let options = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_start_revision(1);
        let Ok(mut ws) = c.watch(format!("{namespace}/"), Some(options)).await else {
            return "(cannot watch)".into();
        };
        let _ = ws.message().await; // created
        let mut out = String::new();
        while let Ok(Ok(Some(resp))) =
            tokio::time::timeout(Duration::from_secs(2), ws.message()).await
        {
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                out.push_str(&format!(
                    "{:?} key={} create={} mod={} lease={:x}\n",
                    ev.event_type(),
                    String::from_utf8_lossy(kv.key()),
                    kv.create_revision(),
                    kv.mod_revision(),
                    kv.lease()
                ));
            }
        }
        out
    }
}

static SHARED: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());

/// The single-member cluster shared by the tests of one binary (see [`super::shared`]).
pub fn shared() -> Option<Arc<EtcdCluster>> {
    super::shared(&SHARED, Kind::Etcd, || EtcdCluster::start(1))
}

/// The conformance factory over an etcd cluster.
#[derive(Debug, Clone)]
pub struct EtcdFactory {
    backend: EtcdBackend,
    /// Keeps the cluster running while the test runs.
    pub cluster: Arc<EtcdCluster>,
}

impl EtcdFactory {
    /// A factory over the shared single-member cluster; `None` if etcd is missing outside CI.
    pub async fn shared() -> Option<EtcdFactory> {
        let cluster = shared()?;
        Some(Self::over(cluster).await)
    }

    /// A factory over `cluster`.
    pub async fn over(cluster: Arc<EtcdCluster>) -> EtcdFactory {
        let backend = connect(&cluster.endpoints()).await;
        EtcdFactory { backend, cluster }
    }

    /// The connected backend.
    pub fn etcd(&self) -> &EtcdBackend {
        &self.backend
    }
}

/// Connects to `endpoints`, retrying (bounded) while the cluster elects a leader.
pub async fn connect(endpoints: &[String]) -> EtcdBackend {
    let start = Instant::now();
    loop {
        match EtcdBackend::connect(endpoints).await {
            Ok(b) => return b,
            Err(e) if start.elapsed() < START_TIMEOUT => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot connect to etcd at {endpoints:?}: {e:?}"),
        }
    }
}

#[async_trait::async_trait]
impl Factory for EtcdFactory {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }

    fn short_ttl(&self) -> Duration {
        fencelock_etcd::MIN_TTL
    }

    async fn delete_as_admin(&self, key: &str) -> Result<()> {
        self.backend
            .client()
            .kv_client()
            .delete(key, None)
            .await
            .map(drop)
            .map_err(|e| fencelock::Error::backend("etcd", "admin delete", false, e))
    }

    /// What `etcdctl lock {namespace}/jobs/` writes (`{namespace}/jobs//{lease}`), a key with
    /// no queue above it, one with a control character, and one that is not UTF-8 (left out
    /// of the listing, so not counted), all on the session's lease.
    async fn write_foreign_keys(&self, namespace: &str, session: &str) -> Result<usize> {
        let lease = i64::from_str_radix(session, 16)
            .map_err(|e| fencelock::Error::invalid_config(session, e.to_string()))?;
        let counted = [
            format!("{namespace}/jobs//{session}").into_bytes(),
            format!("{namespace}/loose").into_bytes(),
            format!("{namespace}/bad\u{7}name/{session}").into_bytes(),
        ];
        let mut not_utf8 = format!("{namespace}/").into_bytes();
        not_utf8.extend_from_slice(b"\xff\xfe/x");
        let mut kv = self.backend.client().kv_client();
        for key in counted.iter().chain([&not_utf8]) {
            kv.put(
                key.clone(),
                "foreign",
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(|e| fencelock::Error::backend("etcd", "foreign put", false, e))?;
        }
        Ok(counted.len())
    }
}
