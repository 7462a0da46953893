//! The quickstart: the seeds' timeline on the in-memory backend, with nothing installed.
//!
//! A takes the lock and gets a fencing token, then stalls (its heartbeats stop, as in a long
//! GC pause). A's own clock tells it the lock is lost before the cluster expires its session;
//! B then gets the lock with a larger token. When A wakes up and writes anyway, the storage
//! refuses the stale token.
//!
//! Run: `cargo run --example quickstart`

use std::time::Duration;

use fencelock::{Error, Fence, FencingToken, MemoryBackend, Session};
use tokio::time::Instant;

/// The protected resource: it remembers the highest token it has seen.
struct Storage {
    fence: Fence,
    value: std::sync::Mutex<String>,
}

impl Storage {
    fn write(&self, who: &str, token: FencingToken, value: &str) -> Result<(), Error> {
        self.fence.admit(token)?;
        *self.value.lock().unwrap() = value.to_string();
        println!("  storage: accepted {who}'s write (token {token}): {value:?}");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let start = Instant::now();
    let t = || format!("t={:>5.2}s", start.elapsed().as_secs_f64());
    let backend = MemoryBackend::new(); // swap for EtcdBackend or ZooKeeperBackend
    let ttl = Duration::from_secs(2);
    let a = Session::builder(backend.clone()).ttl(ttl).start().await?;
    let b = Session::builder(backend).ttl(ttl).start().await?;
    let storage = Storage {
        fence: Fence::new(),
        value: Default::default(),
    };

    let guard_a = a.mutex("jobs/reindex")?.lock().await?;
    let token_a = guard_a.token();
    println!("{} A holds the lock, token {token_a}", t());
    storage.write("A", token_a, "written by A")?;

    println!("{} A stalls (GC pause): its heartbeats stop", t());
    a.halt_heartbeats();
    let lost_a = guard_a.lost();

    let b_waits = tokio::spawn(async move {
        let guard = b.mutex("jobs/reindex")?.lock().await?;
        Ok::<_, Error>((guard, b))
    });

    let reason = lost_a.await;
    println!("{} A's lost() fired by its own clock: {reason}", t());
    let (guard_b, _b) = b_waits.await.expect("task")?;
    println!(
        "{} B holds the lock after A's session expired, token {}",
        t(),
        guard_b.token()
    );
    storage.write("B", guard_b.token(), "written by B")?;

    println!("{} A wakes up and writes with its old token {token_a}", t());
    match storage.write("A", token_a, "late write by A") {
        Err(e @ Error::StaleToken { .. }) => println!("  storage: refused A's write: {e}"),
        other => panic!("the stale write must be refused, got {other:?}"),
    }
    assert_eq!(*storage.value.lock().unwrap(), "written by B");
    println!("{} done: the storage holds B's value", t());
    guard_b.release().await?;
    Ok(())
}
