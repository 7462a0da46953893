//! A fenced SQL table for the examples: PostgreSQL (`tokio-postgres`) or SQLite (`rusqlite`,
//! the embedded variant), with the two guards the seed documents describe.
//!
//! - **The fencing token in the `UPDATE`**: each row keeps the highest token that wrote it, and
//!   a write applies only `WHERE fence <= $token`. A stale holder's write matches no row: the
//!   database itself refuses it, atomically with the check.
//! - **A unique index** as the second guard of an idempotent operation: processing an order
//!   inserts its id into `processed` (primary key) in the same transaction as its effect; a
//!   duplicate delivery conflicts and changes nothing.

use std::sync::{Arc, Mutex};

use fencelock::FencingToken;

/// The database.
#[derive(Clone)]
pub enum Db {
    /// A PostgreSQL server (one connection; transactions take it for their duration).
    Postgres(Arc<tokio::sync::Mutex<tokio_postgres::Client>>),
    /// An SQLite file.
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Db::Postgres(_) => "Db::Postgres",
            Db::Sqlite(_) => "Db::Sqlite",
        })
    }
}

/// A database error, as text (the examples print it).
pub type DbResult<T> = std::result::Result<T, String>;

fn pg(e: tokio_postgres::Error) -> String {
    // The Display of a server error is only "db error": say what the server said.
    match e.as_db_error() {
        Some(db) => format!(
            "postgres: {} ({}): {}",
            db.severity(),
            db.code().code(),
            db.message()
        ),
        None => format!("postgres: {e}"),
    }
}

fn lite(e: rusqlite::Error) -> String {
    format!("sqlite: {e}")
}

/// A row of `accounts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The balance.
    pub balance: i64,
    /// Who wrote it last.
    pub last_writer: String,
    /// The highest token that wrote it.
    pub fence: u64,
}

/// Tokens are unsigned; SQL integers are signed 64-bit (etcd revisions and ZooKeeper zxids fit).
fn sql_token(token: FencingToken) -> i64 {
    i64::try_from(token.get()).unwrap_or(i64::MAX)
}

impl Db {
    /// Connects to PostgreSQL (`host=… port=… user=… dbname=…`).
    pub async fn postgres(conn: &str) -> DbResult<Db> {
        let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls)
            .await
            .map_err(pg)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("postgres connection: {e}");
            }
        });
        Ok(Db::Postgres(Arc::new(tokio::sync::Mutex::new(client))))
    }

    /// Opens (creating) the SQLite file at `path` (`:memory:` for a private one).
    pub fn sqlite(path: &str) -> DbResult<Db> {
        let c = rusqlite::Connection::open(path).map_err(lite)?;
        // Several processes share the file: wait for each other's writes.
        c.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(lite)?;
        Ok(Db::Sqlite(Arc::new(Mutex::new(c))))
    }

    /// Runs `f` on the SQLite connection off the async threads.
    async fn on_sqlite<T: Send + 'static>(
        c: &Arc<Mutex<rusqlite::Connection>>,
        f: impl FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> DbResult<T> {
        let c = c.clone();
        tokio::task::spawn_blocking(move || f(&mut c.lock().unwrap_or_else(|e| e.into_inner())))
            .await
            .map_err(|e| e.to_string())?
            .map_err(lite)
    }

    /// Creates the tables if missing, and the account `id` (balance 0, fence 0) if missing.
    pub async fn setup(&self, id: i64) -> DbResult<()> {
        const TABLES: &str = "
            CREATE TABLE IF NOT EXISTS accounts (
                id BIGINT PRIMARY KEY, balance BIGINT NOT NULL,
                last_writer TEXT NOT NULL, fence BIGINT NOT NULL);
            CREATE TABLE IF NOT EXISTS processed (
                order_id BIGINT PRIMARY KEY, worker TEXT NOT NULL, token BIGINT NOT NULL);
            CREATE TABLE IF NOT EXISTS stock (id BIGINT PRIMARY KEY, quantity BIGINT NOT NULL);";
        const ROWS: &str = "INSERT INTO accounts VALUES (ID, 0, '', 0) ON CONFLICT DO NOTHING;
            INSERT INTO stock VALUES (1, 1000000) ON CONFLICT DO NOTHING;";
        let rows = ROWS.replace("ID", &id.to_string());
        match self {
            Db::Postgres(c) => {
                // Concurrent CREATE TABLE IF NOT EXISTS can race in PostgreSQL: serialize.
                c.lock()
                    .await
                    .batch_execute(&format!(
                        "SELECT pg_advisory_lock(4242); {TABLES} {rows} SELECT pg_advisory_unlock(4242);"
                    ))
                .await
                .map_err(pg)
            }
            Db::Sqlite(c) => {
                Self::on_sqlite(c, move |c| c.execute_batch(&format!("{TABLES} {rows}"))).await
            }
        }
    }

    /// The fenced write: adds `delta` to account `id` as `writer` with `token`, only if no
    /// larger token wrote it before. Returns whether the database applied it.
    pub async fn fenced_add(
        &self,
        id: i64,
        delta: i64,
        writer: &str,
        token: FencingToken,
    ) -> DbResult<bool> {
        let t = sql_token(token);
        let n = match self {
            Db::Postgres(c) => c
                .lock()
                .await
                .execute(
                    "UPDATE accounts SET balance = balance + $1, last_writer = $2, fence = $3 \
                     WHERE id = $4 AND fence <= $3",
                    &[&delta, &writer, &t, &id],
                )
                .await
                .map_err(pg)?,
            Db::Sqlite(c) => {
                let writer = writer.to_string();
                Self::on_sqlite(c, move |c| {
                    c.execute(
                        "UPDATE accounts SET balance = balance + ?1, last_writer = ?2, fence = ?3 \
                         WHERE id = ?4 AND fence <= ?3",
                        rusqlite::params![delta, writer, t, id],
                    )
                })
                .await? as u64
            }
        };
        Ok(n == 1)
    }

    /// Account `id` now.
    pub async fn account(&self, id: i64) -> DbResult<Account> {
        let (balance, last_writer, fence): (i64, String, i64) = match self {
            Db::Postgres(c) => {
                let row = c
                    .lock()
                    .await
                    .query_one(
                        "SELECT balance, last_writer, fence FROM accounts WHERE id = $1",
                        &[&id],
                    )
                    .await
                    .map_err(pg)?;
                (row.get(0), row.get(1), row.get(2))
            }
            Db::Sqlite(c) => {
                Self::on_sqlite(c, move |c| {
                    c.query_row(
                        "SELECT balance, last_writer, fence FROM accounts WHERE id = ?1",
                        [id],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )
                })
                .await?
            }
        };
        Ok(Account {
            balance,
            last_writer,
            fence: fence.max(0) as u64,
        })
    }

    /// Processes order `order` once: in one transaction, records it in `processed` (its
    /// primary key is the second guard) and takes one item out of stock. Returns `false` if it
    /// was processed already (a duplicate delivery): nothing changed.
    pub async fn process_order(
        &self,
        order: i64,
        worker: &str,
        token: FencingToken,
    ) -> DbResult<bool> {
        let t = sql_token(token);
        match self {
            Db::Postgres(c) => {
                let mut c = c.lock().await;
                let tx = c.transaction().await.map_err(pg)?;
                let inserted = tx
                    .execute(
                        "INSERT INTO processed VALUES ($1, $2, $3) ON CONFLICT (order_id) DO NOTHING",
                        &[&order, &worker, &t],
                    )
                    .await
                    .map_err(pg)?;
                if inserted == 1 {
                    tx.execute("UPDATE stock SET quantity = quantity - 1 WHERE id = 1", &[])
                        .await
                        .map_err(pg)?;
                }
                tx.commit().await.map_err(pg)?;
                Ok(inserted == 1)
            }
            Db::Sqlite(c) => {
                let worker = worker.to_string();
                Self::on_sqlite(c, move |c| {
                    let tx = c.transaction()?;
                    let inserted = tx.execute(
                        "INSERT INTO processed VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        rusqlite::params![order, worker, t],
                    )?;
                    if inserted == 1 {
                        tx.execute("UPDATE stock SET quantity = quantity - 1 WHERE id = 1", [])?;
                    }
                    tx.commit()?;
                    Ok(inserted == 1)
                })
                .await
            }
        }
    }

    /// How many orders were processed, and the stock left.
    pub async fn orders(&self) -> DbResult<(i64, i64)> {
        match self {
            Db::Postgres(c) => {
                let row = c
                    .lock()
                    .await
                    .query_one(
                        "SELECT (SELECT count(*) FROM processed), (SELECT quantity FROM stock WHERE id = 1)",
                        &[],
                    )
                    .await
                    .map_err(pg)?;
                Ok((row.get(0), row.get(1)))
            }
            Db::Sqlite(c) => {
                Self::on_sqlite(c, |c| {
                    c.query_row(
                        "SELECT (SELECT count(*) FROM processed), (SELECT quantity FROM stock WHERE id = 1)",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                })
                .await
            }
        }
    }
}
