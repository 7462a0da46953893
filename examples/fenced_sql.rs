//! A fenced write to a real SQL database: the holder of `accounts/{id}` adds to an account's
//! balance with `UPDATE … SET …, fence = $token WHERE id = $id AND fence <= $token`, so that the
//! database itself refuses the write of a holder whose lock has passed to someone else — the
//! holder paused past its TTL of the seed documents' timeline, which wakes up still believing it
//! holds the lock.
//!
//! ```text
//! # the timeline, on the in-memory backend and an in-memory SQLite database:
//! cargo run -p fencelock-examples --example fenced_sql
//! # a holder on a real cluster and database: writes once per line on stdin ("write"),
//! # releases at end of input
//! cargo run -p fencelock-examples --example fenced_sql -- --etcd 127.0.0.1:2379 \
//!     --postgres "host=127.0.0.1 user=postgres" --name writer-a
//! cargo run -p fencelock-examples --example fenced_sql -- --zookeeper 127.0.0.1:2181 \
//!     --sqlite /var/lib/app/accounts.db --name writer-b
//! ```
//!
//! `tests/tests/worked_examples.rs` (`fenced_sql_*`) pauses such a holder (SIGSTOP) past its TTL, lets a
//! successor write, resumes it, and checks that its write is refused by PostgreSQL and by
//! SQLite.

use std::io::BufRead;
use std::time::Duration;

use clap::Parser;
use fencelock::Session;
use fencelock_examples::sql::Db;
use fencelock_examples::BackendArgs;

#[derive(Parser, Debug)]
#[command(about = "Fenced writes to PostgreSQL or SQLite under a fencelock lock")]
struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// A PostgreSQL connection string (`host=… port=… user=… dbname=…`).
    #[arg(long, conflicts_with = "sqlite")]
    postgres: Option<String>,
    /// An SQLite database file.
    #[arg(long)]
    sqlite: Option<String>,
    /// The account to write.
    #[arg(long, default_value_t = 1)]
    account: i64,
    /// This writer's name (recorded with its writes).
    #[arg(long, default_value = "writer")]
    name: String,
    /// The locks' namespace.
    #[arg(long, default_value = fencelock::DEFAULT_NAMESPACE)]
    namespace: String,
    /// The session's TTL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ttl: Duration,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let db = match (&args.postgres, &args.sqlite) {
        (Some(conn), _) => Db::postgres(conn).await?,
        (None, Some(path)) => Db::sqlite(path)?,
        (None, None) => Db::sqlite(":memory:")?,
    };
    db.setup(args.account).await?;
    let (backend, _) = args.backend.connect().await?;
    let session = || {
        Session::builder(backend.clone())
            .namespace(args.namespace.as_str())
            .ttl(args.ttl)
            .start()
    };
    if !args.backend.is_remote() {
        return timeline(session().await?, session().await?, &db, args.account).await;
    }
    holder(session().await?, &db, &args).await
}

/// A holder on a real cluster: writes once per `write` line on stdin, without asking whether it
/// still holds the lock (a paused process could not know), and prints what the database said.
async fn holder(session: Session, db: &Db, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let lock = format!("accounts/{}", args.account);
    let guard = session.mutex(&lock)?.lock().await?;
    println!("HELD {lock} token {}", guard.token());
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        if line.trim() != "write" {
            continue;
        }
        let applied = db
            .fenced_add(args.account, 1, &args.name, guard.token())
            .await?;
        if applied {
            println!("WROTE with token {}", guard.token());
        } else {
            let now = db.account(args.account).await?;
            println!(
                "REFUSED: stale token {}, the row was written with token {} by {}",
                guard.token(),
                now.fence,
                now.last_writer
            );
        }
    }
    if let Err(e) = guard.release().await {
        println!("release: {e}");
    }
    session.close().await?;
    Ok(())
}

/// The timeline on one machine: A writes; B takes over once A's lock is gone and writes; A's
/// late write, with its old token, is refused by the database.
async fn timeline(
    a: Session,
    b: Session,
    db: &Db,
    account: i64,
) -> Result<(), Box<dyn std::error::Error>> {
    let lock = format!("accounts/{account}");
    let ga = a.mutex(&lock)?.lock().await?;
    println!("A holds {lock}, token {}", ga.token());
    assert!(db.fenced_add(account, 10, "A", ga.token()).await?);
    println!("  database: applied A's write (token {})", ga.token());
    let stale = ga.token();
    // A stalls; its lock goes (here: released; on a cluster: its session expires).
    ga.release().await?;
    let gb = b.mutex(&lock)?.lock().await?;
    println!("B holds {lock}, token {}", gb.token());
    assert!(db.fenced_add(account, 5, "B", gb.token()).await?);
    println!("  database: applied B's write (token {})", gb.token());
    println!("A wakes up and writes with its old token {stale}");
    let applied = db.fenced_add(account, 10, "A", stale).await?;
    let row = db.account(account).await?;
    assert!(!applied && row.last_writer == "B");
    println!(
        "  database: refused A's write (the row's fence is {}); balance {}, last written by {}",
        row.fence, row.balance, row.last_writer
    );
    gb.release().await?;
    Ok(())
}
