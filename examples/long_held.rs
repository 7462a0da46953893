//! An operator's check: alert on locks held abnormally long, and optionally ask the holder to
//! let go (a revocation request: the holder's `revoke_requested()` resolves, and it decides).
//!
//! ```text
//! cargo run -p fencelock-examples --example long_held -- --etcd 127.0.0.1:2379 \
//!     --lock jobs/reindex --lock jobs/billing --threshold 30s --every 5s [--revoke]
//! ```
//!
//! Each round it reads every lock's holder and waiters (`Mutex::holder`, `Mutex::waiters`). A
//! grant is one entry: its key and fencing token; a new token under the same key is a new
//! grant. Its age is measured from its creation where the backend records it (ZooKeeper's
//! `ctime`), else from when this check first saw it (etcd records revisions, not times). It
//! prints one `ALERT` line per grant past the threshold and one `RESOLVED` line once that
//! grant ends. Without `--etcd` or `--zookeeper` it runs a demo on the in-memory backend.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use fencelock::{EntryInfo, FencingToken, Session};
use fencelock_examples::{shutdown_signal, BackendArgs};

#[derive(Parser, Debug)]
#[command(about = "Alert on fencelock locks held abnormally long")]
struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// A lock to watch (repeat for several).
    #[arg(long = "lock", required = true)]
    locks: Vec<String>,
    /// The locks' namespace.
    #[arg(long, default_value = fencelock::DEFAULT_NAMESPACE)]
    namespace: String,
    /// How long a grant may last before it is reported.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    threshold: Duration,
    /// How often to look.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    every: Duration,
    /// Also ask the holder of a lock past the threshold to let go.
    #[arg(long)]
    revoke: bool,
}

/// One grant this check has seen: where and when.
struct Seen {
    lock: String,
    first_seen: Instant,
    alerted: bool,
}

/// The grants seen so far, by key and token.
#[derive(Default)]
struct Watch {
    seen: HashMap<(String, FencingToken), Seen>,
}

impl Watch {
    /// How long `holder` has held its lock: from its creation if recorded, else from when it
    /// was first seen.
    fn age(holder: &EntryInfo, seen: &Seen) -> Duration {
        holder
            .created
            .and_then(|c| SystemTime::now().duration_since(c).ok())
            .unwrap_or_else(|| seen.first_seen.elapsed())
    }

    /// One round over `locks`; prints what changed.
    async fn round(&mut self, session: &Session, args: &Args) -> fencelock::Result<()> {
        let mut current = Vec::new();
        for lock in &args.locks {
            let m = session.mutex(lock)?;
            let Some(holder) = m.holder().await? else {
                continue;
            };
            let id = (holder.key.clone(), holder.token);
            current.push(id.clone());
            let seen = self.seen.entry(id).or_insert_with(|| Seen {
                lock: lock.clone(),
                first_seen: Instant::now(),
                alerted: false,
            });
            let age = Self::age(&holder, seen);
            if age < args.threshold || seen.alerted {
                continue;
            }
            seen.alerted = true;
            let waiting = m.waiters().await?.len();
            println!(
                "ALERT {lock}: held for {} by session {} (token {}, key {}), {waiting} waiting",
                humantime::format_duration(round_to_ms(age)),
                holder.session,
                holder.token,
                holder.key
            );
            if args.revoke {
                match m.request_revoke().await? {
                    Some(h) if h.token == holder.token => {
                        println!("REVOKE {lock}: asked session {} to let go", h.session)
                    }
                    Some(_) | None => {}
                }
            }
        }
        // Grants no longer held.
        self.seen.retain(|id, seen| {
            let live = current.contains(id);
            if !live && seen.alerted {
                println!("RESOLVED {}: token {} released", seen.lock, id.1);
            }
            live
        });
        Ok(())
    }
}

fn round_to_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[tokio::main]
async fn main() -> fencelock::Result<()> {
    let args = Args::parse();
    let (backend, what) = args.backend.connect().await?;
    let session = Session::builder(backend)
        .namespace(args.namespace.as_str())
        .start()
        .await?;
    if !args.backend.is_remote() {
        return demo(&session, &args).await;
    }
    println!(
        "watching {} lock(s) on {what} every {}, threshold {}; ctrl-c to stop",
        args.locks.len(),
        humantime::format_duration(args.every),
        humantime::format_duration(args.threshold)
    );
    let mut watch = Watch::default();
    let mut tick = tokio::time::interval(args.every);
    let stop = shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = watch.round(&session, &args).await {
                    println!("check failed: {e}");
                }
            }
            _ = &mut stop => break,
        }
    }
    session.close().await
}

/// On the in-memory backend: a job holds the first lock past the threshold; the check alerts
/// and asks it to let go; the job lets go when asked; the check reports it resolved.
async fn demo(session: &Session, args: &Args) -> fencelock::Result<()> {
    let lock = &args.locks[0];
    let job = session.mutex(lock)?.lock().await?;
    println!("job: holding {lock} (token {})", job.token());
    let job_task = tokio::spawn(async move {
        job.revoke_requested().await;
        println!("job: asked to let go: releasing");
        job.release().await
    });
    let args = Args {
        threshold: Duration::from_millis(300),
        revoke: true,
        ..Args::parse_from(["long_held", "--lock", lock])
    };
    let mut watch = Watch::default();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !job_task.is_finished() && Instant::now() < deadline {
        watch.round(session, &args).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    job_task.await.expect("the job")?;
    watch.round(session, &args).await?;
    Ok(())
}
