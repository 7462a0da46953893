//! The lock family's rows of the benchmark: a read-heavy read-write lock (nine reads for every
//! write) and a counting semaphore, contended, against Apache Curator's
//! `InterProcessReadWriteLock` and `InterProcessSemaphoreV2` on ZooKeeper (and ours alone on
//! etcd, which has no such peer); and the watch notifications each acquisition costs the
//! server, read from the servers' own counters:
//!
//! ([`Notifications`]).
//!
//! Divided by the acquisitions made meanwhile, this is how many waiters a release wakes (plus
//! the handover through the semaphore's gate): constant whatever the number of waiters, if no
//! herd.

use fencelock::Session;

use super::{run_slice, Op};
use fencelock_integration::curator;
use fencelock_integration::load::{our_op, Load};
use fencelock_integration::notifications::Notifications;

/// What one contended run measured.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// Acquisitions per second.
    pub rate: f64,
    /// Watch notifications per acquisition, if the server's counter could be read.
    pub notified: Option<f64>,
}

/// Runs `ops` for `seconds`, counting the server's watch notifications meanwhile.
pub async fn measure(ops: Vec<Op>, seconds: f64, counter: &Notifications) -> Measured {
    let before = counter.read().await;
    let (per_op, t, _) = run_slice(ops, seconds).await;
    let n = per_op.iter().sum::<u64>();
    let after = counter.read().await;
    Measured {
        rate: n as f64 / t,
        notified: before.zip(after).map(|(b, a)| (a - b) / (n.max(1) as f64)),
    }
}

/// Runs Curator's recipe for `load` with `sessions` sessions for `seconds`, counting the
/// server's watch notifications meanwhile (over every acquisition, the warm-up included).
pub async fn measure_curator(
    classes: &curator::JavaClasses,
    connect: &str,
    path: &str,
    load: Load,
    sessions: usize,
    seconds: f64,
    counter: &Notifications,
) -> Result<Measured, String> {
    let before = counter.read().await;
    let r = curator::bench_recipe(
        classes,
        connect,
        path,
        sessions,
        seconds,
        &load.curator_recipe(),
    )
    .await?;
    let after = counter.read().await;
    Ok(Measured {
        rate: r.rate,
        notified: before
            .zip(after)
            .map(|(b, a)| (a - b) / (r.total.max(1) as f64)),
    })
}

/// The header of the family table.
pub fn header(backend: &str, seconds: f64) {
    crate::emit!(
        "\nThe lock family on {backend}: contended acquisitions per second ({seconds} s each, one connection per session), and watch notifications the server sent per acquisition:\n"
    );
    crate::emit!("| workload | sessions | implementation | acquisitions/s | notifications per acquisition | vs Curator |");
    crate::emit!("|---|---:|---|---:|---:|---:|");
}

fn notified(m: &Measured) -> String {
    m.notified.map_or("n/a".to_string(), |n| format!("{n:.2}"))
}

/// One row of ours (and the ratio to Curator's, if measured).
pub fn row(load: Load, sessions: usize, ours: &Measured, curator: Option<&Measured>) {
    let ratio = curator.map_or("".to_string(), |c| format!("{:.2}x", ours.rate / c.rate));
    crate::emit!(
        "| {} | {sessions} | fencelock | {:.0} | {} | {ratio} |",
        load.label(),
        ours.rate,
        notified(ours)
    );
    if let Some(c) = curator {
        crate::emit!(
            "| {} | {sessions} | {} | {:.0} | {} | |",
            load.label(),
            load.curator_name(),
            c.rate,
            notified(c)
        );
    }
}

/// The family rows on ZooKeeper (ours and Curator's, when installed) against the server at
/// `connect` (four-letter words on `port`), for 4 and 16 sessions.
pub async fn zookeeper_family_rows(
    seconds: f64,
    connect: &str,
    port: u16,
    session: impl Fn() -> futures::future::BoxFuture<'static, Session>,
) {
    header("ZooKeeper", seconds);
    let counter = Notifications::ZooKeeper(port);
    let classes = if curator::installed() {
        tokio::task::spawn_blocking(curator::JavaClasses::compile)
            .await
            .ok()
            .and_then(Result::ok)
    } else {
        None
    };
    for load in [Load::Mutex, Load::ReadHeavy, Load::Semaphore(2)] {
        for sessions in [4, 16] {
            let name = format!("family-{sessions}");
            let mut ops = Vec::new();
            for _ in 0..sessions {
                ops.push(our_op(session().await, load, &name));
            }
            let ours = measure(ops, seconds, &counter).await;
            let theirs = match &classes {
                Some(c) => {
                    let path = format!(
                        "/bench/curator-family-{}-{sessions}",
                        load.curator_recipe().replace(':', "-")
                    );
                    match measure_curator(c, connect, &path, load, sessions, seconds, &counter)
                        .await
                    {
                        Ok(m) => Some(m),
                        Err(e) => {
                            crate::emit!("(Curator {} failed: {e})", load.curator_recipe());
                            None
                        }
                    }
                }
                None => None,
            };
            row(load, sessions, &ours, theirs.as_ref());
        }
    }
    if classes.is_none() {
        crate::emit!(
            "
(Apache Curator rows skipped: java, javac or the Curator jars are missing)"
        );
    }
}

/// The family rows on etcd (ours alone) against the member at `addr`, for 4 and 16 sessions.
pub async fn etcd_family_rows(
    seconds: f64,
    addr: &str,
    session: impl Fn() -> futures::future::BoxFuture<'static, Session>,
) {
    header("etcd", seconds);
    let counter = Notifications::Etcd(addr.to_string());
    for load in [Load::Mutex, Load::ReadHeavy, Load::Semaphore(2)] {
        for sessions in [4, 16] {
            let name = format!("family-{sessions}");
            let mut ops = Vec::new();
            for _ in 0..sessions {
                ops.push(our_op(session().await, load, &name));
            }
            let ours = measure(ops, seconds, &counter).await;
            row(load, sessions, &ours, None);
        }
    }
}
