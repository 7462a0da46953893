//! A Redis Cluster for the tests: three primaries and a replica of each, Debian's
//! `redis-server` with `cluster-enabled yes` on free loopback ports (a node is failed over after
//! a second without answering pings), made into a cluster by `redis-cli --cluster create`.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fencelock::backend::Backend;
use fencelock::conformance::Factory;
use fencelock::Result;
use fencelock_redis::RedisBackend;

use super::redis::RedisServer;
use crate::target::{Kind, Target};

/// How many nodes: three primaries, a replica each.
pub const NODES: usize = 6;

/// A running Redis Cluster; its nodes are killed (by PID) when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The nodes killed and not restarted.
    down: Mutex<Vec<usize>>,
    /// The nodes paused (SIGSTOP) and not resumed: asked nothing (they would not answer).
    paused: Mutex<Vec<usize>>,
    /// The slot of the workload's queue, once [`Cluster::leader`] found it.
    workload: Mutex<Option<u16>>,
    /// TLS only, the ACL user `app` (password `app-pw`) on every node.
    tls: bool,
}

impl RedisCluster {
    /// Starts six nodes, makes them a cluster (three primaries with 5,461 slots each, a
    /// replica each), and waits (bounded) until every node says the cluster is ok. Blocking.
    pub fn start() -> RedisCluster {
        Self::make(
            (0..NODES)
                .map(|_| RedisServer::start_cluster_node())
                .collect(),
            false,
        )
    }

    /// Like [`start`](Self::start), TLS only (client port, cluster bus and replication) with
    /// the server certificate of `pki`, and an ACL user `app` (password `app-pw`) on every
    /// node. Blocking.
    pub fn start_tls(pki: &crate::pki::TestPki) -> RedisCluster {
        Self::make(
            (0..NODES)
                .map(|_| RedisServer::start_cluster_node_tls(pki))
                .collect(),
            true,
        )
    }

    fn make(nodes: Vec<RedisServer>, tls: bool) -> RedisCluster {
        let mut create = vec!["--cluster".to_string(), "create".to_string()];
        create.extend(nodes.iter().map(|n| n.addr()));
        create.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let args: Vec<&str> = create.iter().map(String::as_str).collect();
        let out = nodes[0].cli(&args).expect("redis-cli --cluster create");
        assert!(
            out.contains("All 16384 slots covered"),
            "redis-cli --cluster create: {out}"
        );
        let cluster = RedisCluster {
            nodes,
            down: Mutex::new(Vec::new()),
            paused: Mutex::new(Vec::new()),
            workload: Mutex::new(None),
            tls,
        };
        cluster.wait_ok();
        cluster
    }

    /// `redis+cluster://` with every node (`rediss+cluster://app:app-pw@…` over TLS).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| n.addr()).collect();
        if self.tls {
            return format!("rediss+cluster://app:app-pw@{}", nodes.join(","));
        }
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// A backend connected to the cluster.
    pub async fn backend(&self) -> RedisBackend {
        RedisBackend::connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the cluster {}: {e:?}", self.url()))
    }

    /// The nodes that run and answer (neither killed nor paused).
    fn running(&self) -> Vec<usize> {
        let down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        let paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        (0..NODES)
            .filter(|i| !down.contains(i) && !paused.contains(i))
            .collect()
    }

    /// Waits (bounded, blocking) until every running node says `cluster_state:ok` and knows
    /// every slot served by a primary that runs, and every running replica is in sync with
    /// its primary (only a replica that synced can be promoted).
    pub fn wait_ok(&self) {
        let start = Instant::now();
        loop {
            let ok = self.running().iter().all(|&i| {
                let info = self.nodes[i].cli(&["CLUSTER", "INFO"]).unwrap_or_default();
                let repl = self.nodes[i]
                    .cli(&["INFO", "replication"])
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            });
            if ok {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the cluster is not ok after 60 s: {}",
                self.nodes[self.running()[0]]
                    .cli(&["CLUSTER", "NODES"])
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The index of the node that serves `slot` as primary, as a running node sees it (a
    /// primary marked failed, until its replica takes the slot over).
    pub fn primary_of(&self, slot: u16) -> usize {
        let nodes = self.nodes_table();
        let mut failed = None;
        for line in nodes.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 9 || !f[2].contains("master") {
                continue;
            }
            let serves = f[8..].iter().any(|r| match r.split_once('-') {
                Some((a, b)) => {
                    a.parse::<u16>().is_ok_and(|a| a <= slot)
                        && b.parse::<u16>().is_ok_and(|b| slot <= b)
                }
                None => r.parse::<u16>().is_ok_and(|s| s == slot),
            });
            match (serves, self.index_of(f[1])) {
                (true, Some(i)) if !f[2].contains("fail") => return i,
                (true, Some(i)) => failed = Some(i),
                _ => {}
            }
        }
        failed.unwrap_or_else(|| panic!("no primary serves slot {slot}: {nodes}"))
    }

    /// Waits (bounded, blocking) until every replica of primary `i` has what `i` had when
    /// called (its replication offset): "replicated before the fault" as a fact, not a hope
    /// (replication is asynchronous, and a loaded machine can delay it past any fixed sleep).
    pub fn wait_replicated(&self, i: usize) {
        let field = |info: &str, name: &str| -> Option<u64> {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.parse().ok())
        };
        let info = self.nodes[i].cli(&["INFO", "replication"]).unwrap();
        let target = field(&info, "master_repl_offset:")
            .unwrap_or_else(|| panic!("no replication offset on node {i}: {info}"));
        let start = Instant::now();
        loop {
            let info = self.nodes[i].cli(&["INFO", "replication"]).unwrap();
            // `slaveN:ip=…,port=…,state=online,offset=N,lag=…`, one line per replica.
            let offsets: Vec<u64> = info
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                .filter_map(|l| {
                    l.split(',')
                        .find_map(|kv| kv.strip_prefix("offset=")?.parse().ok())
                })
                .collect();
            if !offsets.is_empty() && offsets.iter().all(|&o| o >= target) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "node {i}'s replicas did not reach offset {target} within 30 s: {info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The primaries, as a running node sees them.
    pub fn primaries(&self) -> Vec<usize> {
        self.nodes_table()
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                (f.len() > 2 && f[2].contains("master") && !f[2].contains("fail"))
                    .then(|| self.index_of(f[1]))
                    .flatten()
            })
            .collect()
    }

    /// The replicas of primary `i`, as a running node sees them.
    pub fn replicas_of(&self, i: usize) -> Vec<usize> {
        let id = self.id_of(i);
        self.nodes_table()
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                (f.len() > 3 && f[2].contains("slave") && f[3] == id)
                    .then(|| self.index_of(f[1]))
                    .flatten()
            })
            .collect()
    }

    /// Whether a running node marks the node of ID `id` ([`id_of`](Self::id_of), asked
    /// before it was paused) failed (`fail`, not only suspected: `fail?`).
    pub fn marked_failed(&self, id: &str) -> bool {
        self.nodes_table().lines().any(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            f.len() > 2 && f[0] == id && f[2].split(',').any(|flag| flag == "fail")
        })
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let i = self.running()[0];
        let out = self.nodes[i].cli(&["CLUSTER", "KEYSLOT", key]).unwrap();
        out.trim().parse().unwrap()
    }

    /// The node id of node `i`.
    pub fn id_of(&self, i: usize) -> String {
        self.nodes[i]
            .cli(&["CLUSTER", "MYID"])
            .unwrap()
            .trim()
            .to_string()
    }

    /// Moves `slot` to another primary the way `redis-cli --cluster reshard` does: the target
    /// importing, the source migrating, the keys `MIGRATE`d in batches, then the slot assigned
    /// to the target on every primary. `between` runs after the first batch moved, with the slot
    /// half moved (requests to it meet `ASK` or `TRYAGAIN`). Returns the target. Blocking.
    ///
    /// The target and the source are the nodes that call themselves primaries when asked: with a
    /// 1 s node timeout, a loaded machine can fail a primary over in the shared cluster, and one
    /// node's table may not show it yet (a replica then refuses `SETSLOT`: "only with masters").
    pub fn move_slot(&self, slot: u16, between: impl FnOnce()) -> usize {
        let s = slot.to_string();
        // A node may refuse a moment (a node id it has not heard of yet by gossip, on a loaded
        // machine): asked again for up to 10 s before the move fails.
        let ok = |node: usize, args: &[&str], what: &str| {
            let start = Instant::now();
            loop {
                let out = self.nodes[node].cli(args).unwrap();
                if out.trim() == "OK" || out.trim().is_empty() {
                    return;
                }
                assert!(start.elapsed() < Duration::from_secs(10), "{what}: {out}");
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        let start = Instant::now();
        let (from, to) = loop {
            self.wait_ok();
            let from = self.primary_of(slot);
            let to = self
                .primaries()
                .into_iter()
                .find(|&p| p != from && self.says_primary(p));
            if let Some(to) = to.filter(|_| self.says_primary(from)) {
                let out = self.nodes[to]
                    .cli(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &self.id_of(from)])
                    .unwrap();
                if out.trim() == "OK" {
                    break (from, to);
                }
                assert!(
                    out.contains("only with masters") || out.contains("I don't know"),
                    "importing: {out}"
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no two primaries agree for 30 s: {}",
                self.nodes_table()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let to_id = self.id_of(to);
        ok(
            from,
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id],
            "migrating",
        );
        let mut between = Some(between);
        loop {
            let keys = self.nodes[from]
                .cli(&["CLUSTER", "GETKEYSINSLOT", &s, "2"])
                .unwrap();
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = self.nodes[to].port().to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().copied());
            let out = self.nodes[from].cli(&args).unwrap();
            assert!(
                out.trim() == "OK" || out.trim() == "NOKEY",
                "MIGRATE: {out}"
            );
            if let Some(b) = between.take() {
                b();
            }
        }
        if let Some(b) = between.take() {
            b();
        }
        for i in self.primaries() {
            ok(i, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id], "node");
        }
        self.wait_ok();
        to
    }

    /// Sets every running node's `cluster-node-timeout` (how long a node may miss pings
    /// before the others fail it over). Blocking.
    pub fn set_node_timeout(&self, timeout: Duration) {
        let ms = timeout.as_millis().to_string();
        for i in self.running() {
            let out = self.nodes[i]
                .cli(&["CONFIG", "SET", "cluster-node-timeout", &ms])
                .unwrap();
            assert_eq!(out.trim(), "OK", "node {i}: {out}");
        }
    }

    /// Whether node `i` calls itself a primary (its own `ROLE`, not another node's table).
    fn says_primary(&self, i: usize) -> bool {
        self.nodes[i]
            .cli(&["ROLE"])
            .is_ok_and(|r| r.lines().next() == Some("master"))
    }

    fn nodes_table(&self) -> String {
        let i = self.running()[0];
        self.nodes[i].cli(&["CLUSTER", "NODES"]).unwrap_or_default()
    }

    /// The index of the node at `addr` (`127.0.0.1:PORT@BUS`).
    fn index_of(&self, addr: &str) -> Option<usize> {
        let port: u16 = addr.split('@').next()?.rsplit_once(':')?.1.parse().ok()?;
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// The primary that serves the workload's queue: the one whose loss matters. Found the
    /// first time as the primary with the most of fencelock's queues (in a fresh cluster, the
    /// workload's), then followed by its slot (to the replica that takes it over).
    fn workload_primary(&self) -> usize {
        let mut workload = self.workload.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = *workload {
            return self.primary_of(slot);
        }
        let running = self.running();
        let (primary, queues) = self
            .primaries()
            .into_iter()
            .filter(|i| running.contains(i))
            .map(|i| {
                let keys = self.nodes[i]
                    .cli(&["--scan", "--pattern", "fencelock{*}:q:*"])
                    .unwrap_or_default();
                (i, keys.lines().map(str::to_string).collect::<Vec<_>>())
            })
            .max_by_key(|(_, keys)| keys.len())
            .expect("a primary");
        if let Some(queue) = queues.first() {
            *workload = Some(self.slot_of(queue));
        }
        primary
    }

    /// Waits (bounded) until node `i` is no primary that serves slots any more, and the cluster
    /// is ok: its replica took over.
    fn wait_failed_over(&self, i: usize) -> Duration {
        let start = Instant::now();
        while self.primaries().contains(&i) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "node {i} was not failed over within 30 s: {}",
                self.nodes_table()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_ok();
        start.elapsed()
    }
}

#[async_trait::async_trait]
impl super::Cluster for RedisCluster {
    fn kind(&self) -> Kind {
        Kind::Redis
    }

    fn size(&self) -> usize {
        NODES
    }

    fn endpoint(&self, i: usize) -> String {
        self.nodes[i].addr()
    }

    fn target(&self) -> Target {
        Target::new(Kind::Redis, self.url())
    }

    /// The primary that serves the workload's queues.
    async fn leader(&self) -> usize {
        tokio::task::block_in_place(|| self.workload_primary())
    }

    async fn caught_up(&self) {
        tokio::task::block_in_place(|| self.wait_ok());
    }

    /// SIGKILLs node `i`; a primary's replica takes over (returns once it did).
    fn kill(&self, i: usize) {
        tokio::task::block_in_place(|| {
            let primary = self.primaries().contains(&i);
            self.nodes[i].kill();
            self.down.lock().unwrap().push(i);
            if primary {
                let took = self.wait_failed_over(i);
                println!("redis cluster: primary {i} failed over after {took:.2?}");
            }
        });
    }

    /// Restarts a killed node: it rejoins as a replica of the primary that took over.
    fn restart(&self, i: usize) {
        let was_down = {
            let mut down = self.down.lock().unwrap();
            let at = down.iter().position(|d| *d == i);
            at.map(|at| down.remove(at)).is_some()
        };
        if was_down {
            tokio::task::block_in_place(|| {
                self.nodes[i].restart();
                self.wait_ok();
            });
        }
    }

    fn pause(&self, i: usize) {
        self.paused.lock().unwrap().push(i);
        self.nodes[i].pause();
    }

    fn resume(&self, i: usize) {
        self.nodes[i].resume();
        self.paused.lock().unwrap().retain(|p| *p != i);
    }

    async fn dump(&self, namespace: &str) -> String {
        tokio::task::block_in_place(|| {
            self.running()
                .iter()
                .map(|&i| {
                    let keys = self.nodes[i]
                        .cli(&["--scan", "--pattern", &format!("fencelock*{namespace}*")])
                        .unwrap_or_default();
                    format!("node {i}:\n{keys}")
                })
                .collect()
        })
    }
}

static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());

/// The cluster shared by the tests of one binary; `None` if Redis is missing outside CI.
pub fn shared() -> Option<Arc<RedisCluster>> {
    super::shared(&SHARED, Kind::Redis, || {
        let cluster = RedisCluster::start();
        // No test of the shared cluster fails a node over (those start a cluster of their
        // own): a node timeout of 5 s instead of 1 s keeps a loaded machine's slow pings from
        // failing a primary over under the tests' feet (CI run 64).
        cluster.set_node_timeout(Duration::from_secs(5));
        cluster
    })
}

/// The conformance factory over a Redis Cluster.
#[derive(Debug, Clone)]
pub struct RedisClusterFactory {
    backend: RedisBackend,
    /// Keeps the cluster running while the test runs.
    pub cluster: Arc<RedisCluster>,
}

impl RedisClusterFactory {
    /// A factory over the shared cluster; `None` if Redis is missing outside CI.
    pub async fn shared() -> Option<RedisClusterFactory> {
        let cluster = tokio::task::spawn_blocking(shared).await.ok()??;
        Some(RedisClusterFactory {
            backend: cluster.backend().await,
            cluster,
        })
    }

    /// The connected backend.
    pub fn redis(&self) -> &RedisBackend {
        &self.backend
    }
}

#[async_trait::async_trait]
impl Factory for RedisClusterFactory {
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

impl RedisClusterFactory {
    /// The keys of a name are in its group's slot.
    fn layout(&self) -> super::redis::Layout<'_> {
        super::redis::Layout {
            backend: &self.backend,
            prefix: |name| fencelock_redis::layout::cluster_prefix(name).expect("an entry's name"),
        }
    }
}
