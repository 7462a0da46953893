//! Guarded writes into the store itself: a write into etcd or ZooKeeper that carries the
//! holder's ownership check (`fencelock_etcd::ownership`, `fencelock_zookeeper::add_ownership_check`),
//! so that the store refuses the write of a holder that lost its lock. [`Resource`] is such a
//! protected value; [`run_guarded_holder`] the child process that writes it; and
//! [`paused_holder_guarded_write_is_refused`] the test that pauses that child past its TTL.

use std::io::{BufRead, Write};
use std::time::Duration;

use fencelock::Holding;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::faults::Holder;
use crate::target::{Kind, Target};

/// How long the resource's own ZooKeeper session survives without the process: longer than
/// any pause of the test, so that a paused writer's request reaches the ensemble on its
/// session and is refused by the ownership check, not by an expired session.
const RESOURCE_SESSION: Duration = Duration::from_secs(40);

/// A value kept in the store (an etcd key, a ZooKeeper node) and written only under a grant.
pub struct Resource {
    store: Store,
    path: String,
}

enum Store {
    Etcd(Box<etcd_client::Client>),
    ZooKeeper(zk::Client),
    Redis(fencelock_redis::RedisConnection),
}

impl std::fmt::Debug for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resource")
            .field("path", &self.path)
            .finish()
    }
}

impl Resource {
    /// Connects to `t`'s cluster for the resource `id` (created empty on ZooKeeper).
    pub async fn connect(t: &Target, id: &str) -> Resource {
        let first = t.endpoint.split(',').next().unwrap_or_default().to_string();
        match t.kind {
            Kind::Etcd => {
                let endpoints: Vec<&str> = t.endpoint.split(',').collect();
                let client = etcd_client::Client::connect(endpoints, None)
                    .await
                    .expect("etcd client");
                Resource {
                    store: Store::Etcd(Box::new(client)),
                    path: format!("fencelock-test-resources/{id}"),
                }
            }
            Kind::ZooKeeper => {
                let client = zk::Client::connector()
                    .with_session_timeout(RESOURCE_SESSION)
                    .connect(&first)
                    .await
                    .expect("zookeeper client");
                let path = format!("/fencelock-test-resources/{id}");
                let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                client
                    .mkdir("/fencelock-test-resources", &persistent)
                    .await
                    .expect("resources parent");
                match client.create(&path, b"", &persistent).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(e) => panic!("create {path}: {e}"),
                }
                Resource {
                    store: Store::ZooKeeper(client),
                    path,
                }
            }
            Kind::Redis => {
                let backend = fencelock_redis::RedisBackend::connect(first)
                    .await
                    .expect("redis");
                Resource {
                    store: Store::Redis(backend.connection()),
                    path: format!("fencelock-test-resources/{id}"),
                }
            }
        }
    }

    /// Writes `value` if `grant` still holds, atomically: `true` if the store applied it,
    /// `false` if its ownership check refused it.
    pub async fn write(&self, grant: &(impl Holding + Sync), value: &str) -> bool {
        match &self.store {
            Store::Etcd(client) => {
                let txn = fencelock_etcd::guarded_txn(grant).and_then([etcd_client::TxnOp::put(
                    self.path.as_str(),
                    value,
                    None,
                )]);
                let resp = client.kv_client().txn(txn).await.expect("txn");
                resp.succeeded()
            }
            Store::ZooKeeper(client) => {
                let mut multi = client.new_multi_writer();
                fencelock_zookeeper::add_ownership_check(&mut multi, grant).expect("check");
                multi
                    .add_set_data(&self.path, value.as_bytes(), None)
                    .expect("set data");
                match multi.commit().await {
                    Ok(_) => true,
                    Err(zk::MultiWriteError::OperationFailed {
                        index: 0,
                        source: zk::Error::NoNode,
                    }) => false,
                    Err(e) => panic!("multi: {e}"),
                }
            }
            Store::Redis(con) => {
                fencelock_redis::guarded_set(&mut con.clone(), grant, &self.path, value.as_bytes())
                    .await
                    .expect("guarded set")
            }
        }
    }

    /// The value now.
    pub async fn read(&self) -> String {
        let bytes = match &self.store {
            Store::Etcd(client) => client
                .kv_client()
                .get(self.path.as_str(), None)
                .await
                .expect("get")
                .kvs()
                .first()
                .map(|kv| kv.value().to_vec())
                .unwrap_or_default(),
            Store::ZooKeeper(client) => client.get_data(&self.path).await.expect("get").0,
            Store::Redis(con) => redis::cmd("GET")
                .arg(&self.path)
                .query_async::<Option<Vec<u8>>>(&mut con.clone())
                .await
                .expect("get")
                .unwrap_or_default(),
        };
        String::from_utf8(bytes).expect("utf-8")
    }
}

/// The body of `holder hold <kind> <endpoints> <namespace> guarded <name> <ttl-ms>`: takes the
/// lock, prints `HELD <token>`, then for each line `write <value>` on stdin writes the resource
/// named like the namespace under its guard, without asking the library whether it still
/// holds, and prints `WROTE` or `REFUSED`.
pub async fn run_guarded_holder(t: &Target, namespace: &str, name: &str, ttl: Duration) {
    let session = t.session(namespace, ttl).await;
    let resource = Resource::connect(t, &resource_id(namespace)).await;
    let guard = session.mutex(name).unwrap().lock().await.expect("lock");
    say(&format!("HELD {}", guard.token()));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    while let Some(line) = rx.recv().await {
        if let Some(value) = line.strip_prefix("write ") {
            let applied = resource.write(&guard, value).await;
            say(if applied { "WROTE" } else { "REFUSED" });
        }
    }
    std::future::pending::<()>().await;
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// The resource of a test namespace.
fn resource_id(namespace: &str) -> String {
    namespace.replace('/', "-")
}

/// A holder in another process writes the resource under its guard; SIGSTOPped past its TTL,
/// it loses the lock to a successor, which writes too; resumed, its guarded write (sent with
/// the stale guard, without asking the library) is refused by the store itself, and the
/// successor's value stays.
pub async fn paused_holder_guarded_write_is_refused(holder_bin: &str, t: &Target, ttl: Duration) {
    let ns = fencelock::conformance::unique_namespace("guarded_write");
    let resource = Resource::connect(t, &resource_id(&ns)).await;
    let mut child = Holder::start(holder_bin, t, &ns, "guarded", "m", ttl);
    child.say("write from the first holder");
    assert_eq!(child.next_line(Duration::from_secs(30)), "WROTE");
    assert_eq!(resource.read().await, "from the first holder");

    child.pause();
    child.say("write stale");
    let successor = t.session(&ns, Duration::from_secs(10)).await;
    let m = successor.mutex("m").unwrap();
    let start = Instant::now();
    let g = tokio::time::timeout(ttl * 3 + Duration::from_secs(20), m.lock())
        .await
        .expect("the successor is granted once the paused holder's session expired")
        .unwrap();
    assert!(g.token().get() > child.token);
    assert!(resource.write(&g, "from the successor").await);
    child.resume();
    assert_eq!(
        child.next_line(Duration::from_secs(30)),
        "REFUSED",
        "the store refused the stale holder's write ({:?} after the pause)",
        start.elapsed()
    );
    assert_eq!(resource.read().await, "from the successor");
    g.release().await.unwrap();
    successor.close().await.unwrap();
}
