//! The quickstart: the seeds' timeline on the in-memory backend, with nothing installed.
//!
//! A takes the lock and gets a fencing token, then its process stalls (a stop-the-world pause:
//! here A's whole runtime thread sleeps, so nothing of A runs, its heartbeats neither). The
//! cluster expires A's session after the TTL, and B gets the lock with a larger token. When A
//! wakes up, its guard knows it is no longer held (the local deadline passed during the pause);
//! a careless A writes anyway, and the storage refuses the stale token. Fencing, not hope.
//!
//! Run: `cargo run --example quickstart`

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Error, Fence, FencingToken, MemoryBackend, Session};
use tokio::time::Instant;

/// The protected resource: it remembers the highest token it has seen.
#[derive(Default)]
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

const TTL: Duration = Duration::from_secs(2);
const PAUSE: Duration = Duration::from_secs(3);

#[tokio::main]
async fn main() -> Result<(), Error> {
    let start = Instant::now();
    let t = move || format!("t={:>5.2}s", start.elapsed().as_secs_f64());
    let backend = MemoryBackend::new(); // swap for EtcdBackend or ZooKeeperBackend
    let storage = Arc::new(Storage::default());

    // A runs on a runtime of its own, on a thread of its own, like a process of its own.
    let (holding_tx, holding) = mpsc::channel();
    let process_a = std::thread::spawn({
        let (backend, storage) = (backend.clone(), storage.clone());
        move || -> Result<(), Error> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for A");
            rt.block_on(async {
                let a = Session::builder(backend).ttl(TTL).start().await?;
                let guard = a.mutex("jobs/reindex")?.lock().await?;
                let token = guard.token();
                println!("{} A holds the lock, token {token}", t());
                storage.write("A", token, "written by A")?;
                let _ = holding_tx.send(());
                println!(
                    "{} A stalls: a {PAUSE:?} stop-the-world pause, nothing of A runs",
                    t()
                );
                std::thread::sleep(PAUSE); // the pause: A's only thread stops
                println!(
                    "{} A wakes up; its guard says held = {} ({})",
                    t(),
                    guard.is_held(),
                    guard.lost().await
                );
                println!("{} A writes anyway, with its old token {token}", t());
                match storage.write("A", token, "late write by A") {
                    Err(e @ Error::StaleToken { .. }) => {
                        println!("  storage: refused A's write: {e}")
                    }
                    other => panic!("the stale write must be refused, got {other:?}"),
                }
                Ok(())
            })
        }
    });

    holding.recv().expect("A holds the lock");
    let b = Session::builder(backend).ttl(TTL).start().await?;
    let guard_b = b.mutex("jobs/reindex")?.lock().await?;
    println!(
        "{} B holds the lock once the cluster expired A's session, token {}",
        t(),
        guard_b.token()
    );
    storage.write("B", guard_b.token(), "written by B")?;

    tokio::task::spawn_blocking(move || process_a.join())
        .await
        .expect("join")
        .expect("A's thread")?;
    assert_eq!(*storage.value.lock().unwrap(), "written by B");
    println!("{} done: the storage holds B's value", t());
    guard_b.release().await?;
    Ok(())
}
