//! Idempotent order processing: every order may be delivered more than once, to different
//! workers (an at-least-once queue); each is processed once. Two guards:
//!
//! 1. the lock `orders/{id}`: two workers never process the same order at the same time;
//! 2. a unique index: processing inserts the order id into `processed` (its primary key) in the
//!    same transaction as its effect, so a duplicate — after the first was committed, or from a
//!    holder whose lock was lost — conflicts and changes nothing.
//!
//! ```text
//! # each worker receives every order of the range (so every order is delivered N times):
//! cargo run -p fencelock-examples --example orders -- --etcd 127.0.0.1:2379 \
//!     --postgres "host=127.0.0.1 user=postgres" --worker w1 --orders 1-100
//! ```
//!
//! It prints `DONE processed=P duplicates=D`; across workers the processed counts add up to
//! the number of orders, and the stock went down by exactly that much. Without `--etcd` or
//! `--zookeeper`: three workers in this process, on the in-memory backend and SQLite.

use std::time::Duration;

use clap::Parser;
use fencelock::Session;
use fencelock_examples::sql::Db;
use fencelock_examples::BackendArgs;

#[derive(Parser, Debug, Clone)]
#[command(about = "Idempotent order processing with fencelock and a unique index")]
struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// A PostgreSQL connection string.
    #[arg(long, conflicts_with = "sqlite")]
    postgres: Option<String>,
    /// An SQLite database file.
    #[arg(long)]
    sqlite: Option<String>,
    /// This worker's name.
    #[arg(long, default_value = "worker")]
    worker: String,
    /// The orders delivered to this worker: `FIRST-LAST`.
    #[arg(long, default_value = "1-20", value_parser = range)]
    orders: (i64, i64),
    /// The locks' namespace.
    #[arg(long, default_value = fencelock::DEFAULT_NAMESPACE)]
    namespace: String,
    /// The session's TTL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ttl: Duration,
}

fn range(s: &str) -> Result<(i64, i64), String> {
    let (a, b) = s.split_once('-').ok_or("FIRST-LAST")?;
    let (a, b): (i64, i64) = (
        a.parse().map_err(|e| format!("{a}: {e}"))?,
        b.parse().map_err(|e| format!("{b}: {e}"))?,
    );
    if a > b || b - a > 1_000_000 {
        return Err(format!("{s}: not a range of at most a million orders"));
    }
    Ok((a, b))
}

/// Processes the orders of `args` (in an order of its own, so that workers collide).
async fn work(
    session: Session,
    db: Db,
    args: Args,
) -> Result<(u64, u64), Box<dyn std::error::Error + Send + Sync>> {
    let (first, last) = args.orders;
    let mut ids: Vec<i64> = (first..=last).collect();
    // Each worker goes through the deliveries in its own order.
    let shift = args.worker.bytes().map(usize::from).sum::<usize>() % ids.len().max(1);
    ids.rotate_left(shift);
    let (mut processed, mut duplicates) = (0, 0);
    for id in ids {
        let guard = session.mutex(&format!("orders/{id}"))?.lock().await?;
        if db.process_order(id, &args.worker, guard.token()).await? {
            processed += 1;
        } else {
            duplicates += 1;
        }
        guard.release().await?;
    }
    Ok((processed, duplicates))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    let db = match (&args.postgres, &args.sqlite) {
        (Some(conn), _) => Db::postgres(conn).await?,
        (None, Some(path)) => Db::sqlite(path)?,
        (None, None) => Db::sqlite(":memory:")?,
    };
    db.setup(0).await?;
    let (backend, _) = args.backend.connect().await?;
    let start = |backend| {
        Session::builder(backend)
            .namespace(args.namespace.as_str())
            .ttl(args.ttl)
            .start()
    };
    if !args.backend.is_remote() {
        let (before_count, before_stock) = db.orders().await?;
        let mut tasks = Vec::new();
        for w in ["w1", "w2", "w3"] {
            let args = Args {
                worker: w.into(),
                ..args.clone()
            };
            let s = start(backend.clone()).await?;
            tasks.push(tokio::spawn(work(s, db.clone(), args)));
        }
        for (w, t) in ["w1", "w2", "w3"].iter().zip(tasks) {
            let (p, d) = t.await.expect("worker")?;
            println!("{w}: processed={p} duplicates={d}");
        }
        let (count, stock) = db.orders().await?;
        println!(
            "orders processed: {} (each once); stock went down by {}",
            count - before_count,
            before_stock - stock
        );
        return Ok(());
    }
    let session = start(backend).await?;
    let (p, d) = work(session.clone(), db, args).await?;
    println!("DONE processed={p} duplicates={d}");
    session.close().await?;
    Ok(())
}
