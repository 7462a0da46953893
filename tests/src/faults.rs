//! Fault scenarios shared by the backends: a leader killed in another process, a leader or
//! holder cut off by a proxy. Each takes a [`Target`] (which backend, where).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fencelock::backend::Backend;
use fencelock::{Error, Fence, Session};
use tokio::time::Instant;

use crate::proxy::{Mode, Proxy};

/// Which backend a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// etcd (endpoint `host:port`).
    Etcd,
    /// ZooKeeper (connect string `host:port`).
    ZooKeeper,
}

/// A backend kind and the server's client address.
#[derive(Debug, Clone)]
pub struct Target {
    /// Which backend.
    pub kind: Kind,
    /// The server's client address, `127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Target {
    /// Connects a backend to `addr` (the server itself, or a proxy in front of it), retrying
    /// while the cluster elects a leader; panics if it cannot.
    pub async fn backend_at(&self, addr: &str) -> Arc<dyn Backend> {
        match self.kind {
            Kind::Etcd => {
                Arc::new(crate::etcd::connect_all(&addr.split(',').collect::<Vec<_>>()).await)
            }
            Kind::ZooKeeper => self
                .try_backend_at(addr)
                .await
                .expect("connect to ZooKeeper"),
        }
    }

    /// Connects a backend to `addr` once (bounded by the backend's connect timeout).
    pub async fn try_backend_at(&self, addr: &str) -> fencelock::Result<Arc<dyn Backend>> {
        Ok(match self.kind {
            Kind::Etcd => Arc::new(
                fencelock_etcd::EtcdBackend::connect(addr.split(',').collect::<Vec<_>>()).await?,
            ),
            Kind::ZooKeeper => {
                Arc::new(fencelock_zookeeper::ZooKeeperBackend::connect(addr).await?)
            }
        })
    }

    /// Opens a session on `addr` in `namespace`.
    pub async fn session_at(&self, addr: &str, namespace: &str, ttl: Duration) -> Session {
        Session::builder(self.backend_at(addr).await)
            .namespace(namespace)
            .ttl(ttl)
            .start()
            .await
            .expect("session")
    }

    fn arg(&self) -> &'static str {
        match self.kind {
            Kind::Etcd => "etcd",
            Kind::ZooKeeper => "zookeeper",
        }
    }
}

/// A child process (the `holder` binary) holding a lock or leading an election.
pub struct Holder {
    child: Child,
    /// The token (epoch) the child was granted.
    pub token: u64,
}

impl Holder {
    /// Starts `holder_bin` (followed by `prefix_args`, e.g. the bench's `holder` mode) and
    /// waits (bounded) until it holds `name`.
    pub fn start_with(
        holder_bin: &str,
        prefix_args: &[&str],
        t: &Target,
        namespace: &str,
        kind: &str,
        name: &str,
        ttl: Duration,
    ) -> Holder {
        let mut child = Command::new(holder_bin)
            .args(prefix_args)
            .args([t.arg(), &t.endpoint, namespace, kind, name])
            .arg(ttl.as_millis().to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start holder");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("holder reports HELD within 30 s");
        let token = line
            .trim()
            .strip_prefix("HELD ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("holder said {line:?}"));
        Holder { child, token }
    }

    /// Starts the `holder` binary and waits (bounded) until it holds `name`.
    pub fn start(
        holder_bin: &str,
        t: &Target,
        namespace: &str,
        kind: &str,
        name: &str,
        ttl: Duration,
    ) -> Holder {
        Self::start_with(holder_bin, &[], t, namespace, kind, name, ttl)
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal by name (`STOP`, `CONT`) to the child, by its PID.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {}", self.pid());
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.signal_quiet();
        self.kill();
    }
}

impl Holder {
    fn signal_quiet(&self) -> std::io::Result<std::process::ExitStatus> {
        Command::new("kill")
            .arg("-CONT")
            .arg(self.pid().to_string())
            .stderr(Stdio::null())
            .status()
    }
}

/// The body of the `holder` child process: `args` are
/// `<etcd|zookeeper> <endpoint> <namespace> <lock|election> <name> <ttl-ms>`. Takes the lock or
/// leads the election, prints `HELD <token>`, then waits forever.
pub async fn run_holder(args: &[String]) {
    use std::io::Write;
    let [backend, endpoint, namespace, kind, name, ttl] = args else {
        eprintln!(
            "usage: holder <etcd|zookeeper> <endpoint> <namespace> <lock|election> <name> <ttl-ms>"
        );
        std::process::exit(2);
    };
    let kind_of = match backend.as_str() {
        "etcd" => Kind::Etcd,
        "zookeeper" => Kind::ZooKeeper,
        other => panic!("unknown backend {other}"),
    };
    let t = Target {
        kind: kind_of,
        endpoint: endpoint.clone(),
    };
    let ttl = Duration::from_millis(ttl.parse().expect("ttl in ms"));
    let session = t.session_at(endpoint, namespace, ttl).await;
    let token = match kind.as_str() {
        "lock" => {
            let g = session.mutex(name).unwrap().lock().await.expect("lock");
            let t = g.token();
            std::mem::forget(g);
            t
        }
        "election" => {
            let e = session.election(name).unwrap();
            let l = e.campaign(b"child").await.expect("campaign");
            let t = l.epoch();
            std::mem::forget(l);
            t
        }
        other => panic!("unknown kind {other}"),
    };
    println!("HELD {token}");
    std::io::stdout().flush().unwrap();
    futures::future::pending::<()>().await;
}

fn unique(test: &str) -> String {
    fencelock::conformance::unique_namespace(test)
}

/// A leader whose process is SIGKILLed is replaced within TTL + 2 s, with a larger epoch.
/// Returns the failover time.
pub async fn killed_leader_is_replaced(holder_bin: &str, t: &Target, ttl: Duration) -> Duration {
    let ns = unique("killed_leader");
    let mut child = Holder::start(holder_bin, t, &ns, "election", "e", ttl);
    let successor = t
        .session_at(&t.endpoint, &ns, Duration::from_secs(10))
        .await;
    let election = successor.election("e").unwrap();
    assert_eq!(
        election.leader().await.unwrap().map(|l| l.epoch.get()),
        Some(child.token),
        "the child leads"
    );
    let campaign = tokio::spawn(async move {
        let l = election.campaign(b"successor").await;
        (l, Instant::now())
    });
    let killed_at = Instant::now();
    child.kill();
    let (leader, led_at) = tokio::time::timeout(ttl + Duration::from_secs(10), campaign)
        .await
        .expect("a successor leads")
        .unwrap();
    let leader = leader.unwrap();
    let failover = led_at - killed_at;
    assert!(
        failover <= ttl + Duration::from_secs(2),
        "replaced within TTL + 2 s, took {failover:?}"
    );
    assert!(leader.epoch().get() > child.token);
    leader.resign().await.unwrap();
    successor.close().await.unwrap();
    failover
}

/// A leader cut off from the cluster (black-holed by a proxy) fires `lost()` before its
/// successor's `campaign()` returns.
pub async fn cut_off_leader_steps_down_first(t: &Target, ttl: Duration) {
    let ns = unique("cut_off_leader");
    let proxy = Proxy::start(&t.endpoint).await;
    let a = t.session_at(&proxy.addr(), &ns, ttl).await;
    let b = t
        .session_at(&t.endpoint, &ns, Duration::from_secs(10))
        .await;
    let la = a.election("e").unwrap().campaign(b"a").await.unwrap();
    let lost = la.lost();
    let lost_at = tokio::spawn(async move {
        let r = lost.await;
        (r, Instant::now())
    });
    let eb = b.election("e").unwrap();
    let campaign = tokio::spawn(async move {
        let l = eb.campaign(b"b").await;
        (l, Instant::now())
    });
    proxy.set(Mode::BlackHole);
    let (lb, b_at) = tokio::time::timeout(ttl * 3 + Duration::from_secs(20), campaign)
        .await
        .expect("successor within bound")
        .unwrap();
    let lb = lb.unwrap();
    let (reason, a_at) = tokio::time::timeout(Duration::from_secs(5), lost_at)
        .await
        .expect("old leader's lost() fired")
        .unwrap();
    assert!(
        a_at <= b_at,
        "old leader stepped down ({reason}) before the successor led"
    );
    assert!(!la.is_leader());
    assert!(lb.epoch() > la.epoch());
    lb.resign().await.unwrap();
    b.close().await.unwrap();
    drop(proxy);
}

/// A lock holder cut off past its TTL: its `lost()` fires before the next holder is granted,
/// the next token is larger, and the fence refuses the stale holder's late write. After the
/// network heals, the stale session stays lost (terminal).
pub async fn cut_off_holder_is_fenced(t: &Target, ttl: Duration) {
    let ns = unique("cut_off_holder");
    let proxy = Proxy::start(&t.endpoint).await;
    let a = t.session_at(&proxy.addr(), &ns, ttl).await;
    let b = t
        .session_at(&t.endpoint, &ns, Duration::from_secs(10))
        .await;
    let fence = Fence::new();
    let ga = a.mutex("m").unwrap().lock().await.unwrap();
    fence.admit(ga.token()).unwrap();
    let lost = ga.lost();
    let lost_at = tokio::spawn(async move {
        lost.await;
        Instant::now()
    });
    let mb = b.mutex("m").unwrap();
    let waiter = tokio::spawn(async move {
        let g = mb.lock().await;
        (g, Instant::now())
    });
    proxy.set(Mode::BlackHole);
    let (gb, b_at) = tokio::time::timeout(ttl * 3 + Duration::from_secs(20), waiter)
        .await
        .expect("next holder within bound")
        .unwrap();
    let gb = gb.unwrap();
    let a_at = tokio::time::timeout(Duration::from_secs(5), lost_at)
        .await
        .expect("lost fired")
        .unwrap();
    assert!(a_at <= b_at, "the cut-off holder knew first");
    assert!(gb.token() > ga.token());
    fence.admit(gb.token()).unwrap();
    assert!(matches!(
        fence.admit(ga.token()),
        Err(Error::StaleToken { .. })
    ));
    proxy.set(Mode::Pass);
    assert!(
        !ga.is_held(),
        "a lost session stays lost after the network heals"
    );
    assert!(matches!(
        a.mutex("m").unwrap().try_lock().await,
        Err(Error::SessionLost(_))
    ));
    gb.release().await.unwrap();
    b.close().await.unwrap();
}

/// Generates the fault tests of one backend: `$target` is a future of
/// `Option<(guard, Target)>` (`None` skips; the guard keeps the server running), `$ttl` the
/// session TTL, `$holder` the path of the `holder` binary.
#[macro_export]
macro_rules! fault_tests {
    ($target:expr, $ttl:expr, $holder:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn killed_leader_is_replaced() {
            let Some((_guard, t)) = $target.await else {
                return;
            };
            $crate::faults::killed_leader_is_replaced($holder, &t, $ttl).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn cut_off_leader_steps_down_first() {
            let Some((_guard, t)) = $target.await else {
                return;
            };
            $crate::faults::cut_off_leader_steps_down_first(&t, $ttl).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn cut_off_holder_is_fenced() {
            let Some((_guard, t)) = $target.await else {
                return;
            };
            $crate::faults::cut_off_holder_is_fenced(&t, $ttl).await;
        }
    };
}
