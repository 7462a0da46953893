//! The scale rows of the benchmark, for both backends, each next to its peers on the same
//! server in one run:
//!
//! - **Held locks**: one session takes `n` distinct locks, 64 acquisitions in flight, and holds
//!   them: acquisitions per second, client memory per held lock (the benchmark's counting
//!   allocator), and the server's watch count while they are held. On etcd also what the
//!   server allows with no recipe: keys put, then deleted plainly or guarded by a txn.
//! - **Handoffs against the queue's length**: `w` waiters, each its own session, queued on one
//!   lock; the holder releases and each waiter releases as soon as it is granted; the time from
//!   one grant's release to the next grant (p50, p99 over the first handoffs, while the queue is
//!   still about `w` long).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::Session;
use futures::{stream, StreamExt};
use zookeeper_client as zk;

use super::alloc::allocated;
use super::Samples;
use fencelock_integration::servers::fourlw;
use fencelock_integration::target::Kind;

/// Acquisitions in flight while taking many locks.
pub const IN_FLIGHT: usize = 64;

/// One held-locks measurement.
#[derive(Debug, Clone)]
pub struct HeldRow {
    /// Which implementation.
    pub implementation: String,
    /// How many locks.
    pub locks: usize,
    /// Acquisitions per second while taking them (`None`: a raw row, which acquires nothing).
    pub rate: Option<f64>,
    /// Releases per second while releasing them all (64 in flight).
    pub release_rate: f64,
    /// Client bytes per held lock, if counted.
    pub bytes_per_lock: Option<f64>,
    /// Server-side watches while they are held, if read.
    pub server_watches: Option<u64>,
}

/// One handoff measurement.
#[derive(Debug, Clone)]
pub struct HandoffRow {
    /// Which implementation.
    pub implementation: String,
    /// Waiters queued.
    pub waiters: usize,
    /// Handoff latency.
    pub samples: Samples,
}

/// The server's current watch count.
async fn watches(kind: Kind, endpoint: &str, zk_port: Option<u16>) -> Option<u64> {
    match kind {
        Kind::Etcd => fencelock_integration::notifications::etcd_counter(
            endpoint,
            "etcd_debugging_mvcc_watcher_total",
            "",
        )
        .await
        .map(|v| v as u64),
        Kind::ZooKeeper => {
            let mntr = fourlw::ask_async(zk_port?, "mntr").await?;
            fourlw::mntr_value(&mntr, "zk_watch_count")
        }
        Kind::Redis => None,
    }
}

fn per_lock(before: Option<isize>, after: Option<isize>, n: usize) -> Option<f64> {
    Some((after? - before?) as f64 / n as f64)
}

/// The server watches added between two counts (the sessions of earlier rows keep theirs: on
/// etcd, each the watch of its last wait).
fn added(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

/// Ours: one session takes `n` distinct locks and holds them.
pub async fn held_ours(
    kind: Kind,
    endpoint: &str,
    zk_port: Option<u16>,
    session: Session,
    n: usize,
    rep: usize,
) -> HeldRow {
    // Names new to the server in every repetition.
    let names: Vec<String> = (0..n).map(|i| format!("held/{n}/r{rep}/{i}")).collect();
    let watches_before = watches(kind, endpoint, zk_port).await;
    let before = allocated();
    let start = Instant::now();
    let guards: Vec<fencelock::Guard> = stream::iter(&names)
        .map(|name| {
            let s = session.clone();
            async move { s.mutex(name).unwrap().lock().await.expect("lock") }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let bytes = per_lock(before, allocated(), n);
    let server_watches = added(watches_before, watches(kind, endpoint, zk_port).await);
    let start = Instant::now();
    stream::iter(guards)
        .map(|g| async move { g.release().await.expect("release") })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
    let release_rate = n as f64 / start.elapsed().as_secs_f64();
    HeldRow {
        implementation: "fencelock Mutex".into(),
        locks: n,
        rate: Some(rate),
        release_rate,
        bytes_per_lock: bytes,
        server_watches,
    }
}

/// etcd-client's `lock()`, one lease, `n` distinct locks.
pub async fn held_etcd_client(endpoint: &str, n: usize, rep: usize) -> HeldRow {
    let client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let lease = client.lease_client().grant(300, None).await.unwrap().id();
    let names: Vec<String> = (0..n)
        .map(|i| format!("bench/peer-held/{n}/r{rep}/{i}"))
        .collect();
    let watches_before = watches(Kind::Etcd, endpoint, None).await;
    let before = allocated();
    let start = Instant::now();
    let keys: Vec<Vec<u8>> = stream::iter(&names)
        .map(|name| {
            let mut c = client.clone();
            async move {
                let opts = etcd_client::LockOptions::new().with_lease(lease);
                c.lock(name.as_str(), Some(opts))
                    .await
                    .unwrap()
                    .key()
                    .to_vec()
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let bytes = per_lock(before, allocated(), n);
    let server_watches = added(watches_before, watches(Kind::Etcd, endpoint, None).await);
    let start = Instant::now();
    stream::iter(keys)
        .map(|k| {
            let mut c = client.clone();
            async move { c.unlock(k).await.unwrap() }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    let release_rate = n as f64 / start.elapsed().as_secs_f64();
    let _ = client.lease_client().revoke(lease).await;
    HeldRow {
        implementation: "etcd-client lock()".into(),
        locks: n,
        rate: Some(rate),
        release_rate,
        bytes_per_lock: bytes,
        server_watches,
    }
}

/// What etcd itself allows for the held-locks row, no lock recipe involved: `n` keys put under
/// one lease (64 in flight), then deleted, either by a plain delete (`guarded` false: what
/// etcd-client's `unlock` amounts to on the server) or by a txn that deletes the key only if it
/// is still the same entry (a compare on its create revision: the shape of our release, which
/// never deletes a newer entry under the same key).
pub async fn held_etcd_raw(endpoint: &str, n: usize, rep: usize, guarded: bool) -> HeldRow {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let lease = client.lease_client().grant(300, None).await.unwrap().id();
    let shape = if guarded { "guarded" } else { "plain" };
    let names: Vec<String> = (0..n)
        .map(|i| format!("bench/raw-held/{shape}/{n}/r{rep}/{i}"))
        .collect();
    let keys: Vec<(String, i64)> = stream::iter(names)
        .map(|name| {
            let mut kv = client.kv_client();
            async move {
                let put = kv
                    .put(name.as_str(), "", Some(PutOptions::new().with_lease(lease)))
                    .await
                    .unwrap();
                (name, put.header().expect("header").revision())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let start = Instant::now();
    stream::iter(keys)
        .map(|(key, created)| {
            let mut kv = client.kv_client();
            async move {
                if guarded {
                    let same = Compare::create_revision(key.as_str(), CompareOp::Equal, created);
                    let txn = Txn::new()
                        .when([same])
                        .and_then([TxnOp::delete(key.as_str(), None)]);
                    assert!(kv.txn(txn).await.unwrap().succeeded());
                } else {
                    kv.delete(key.as_str(), None).await.unwrap();
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
    let release_rate = n as f64 / start.elapsed().as_secs_f64();
    let _ = client.lease_client().revoke(lease).await;
    HeldRow {
        implementation: format!("raw: put + {shape} delete"),
        locks: n,
        // Not a lock's acquisition.
        rate: None,
        release_rate,
        bytes_per_lock: None,
        server_watches: None,
    }
}

/// zookeeper-client's lock recipe (`Client::lock`), one session, `n` distinct locks.
pub async fn held_zk_recipe(connect: &str, zk_port: u16, n: usize, rep: usize) -> HeldRow {
    let client = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(connect)
        .await
        .unwrap();
    let dirs: Vec<String> = (0..n)
        .map(|i| format!("/bench/peer-held/{n}/r{rep}/{i}"))
        .collect();
    let watches_before = watches(Kind::ZooKeeper, connect, Some(zk_port)).await;
    let before = allocated();
    let start = Instant::now();
    let held: Vec<zk::OwnedLockClient> = stream::iter(&dirs)
        .map(|dir| {
            let c = client.clone();
            async move {
                let prefix = zk::LockPrefix::new_curator(dir, "lock-").unwrap();
                let options = zk::LockOptions::new(zk::Acls::anyone_all())
                    .with_ancestor_options(
                        zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()),
                    )
                    .unwrap();
                c.lock(prefix, b"", options).await.unwrap().into_owned()
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let bytes = per_lock(before, allocated(), n);
    let server_watches = added(
        watches_before,
        watches(Kind::ZooKeeper, connect, Some(zk_port)).await,
    );
    let start = Instant::now();
    stream::iter(held)
        .map(|l| async move {
            l.delete(l.lock_path(), None).await.unwrap();
            std::mem::forget(l); // released above, confirmed
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
    let release_rate = n as f64 / start.elapsed().as_secs_f64();
    HeldRow {
        implementation: "zookeeper-client Client::lock".into(),
        locks: n,
        rate: Some(rate),
        release_rate,
        bytes_per_lock: bytes,
        server_watches,
    }
}

/// How many handoffs of a chain are timed: the first ones, while the queue is still about as
/// long as it started.
const HANDOFFS_TIMED: usize = 50;

/// When a waiter was granted, and when it called its release (at once).
pub type Turn = (Instant, Instant);

/// Runs a handoff chain: `waiters` acquisitions started (by `queue_one`, which gives back the
/// future of each turn) behind a holder; once `queued` says every one is queued on the server,
/// the holder is released by `release`; each waiter releases as soon as it is granted. Returns
/// the handoff latencies — from one holder's release call to the next grant — of the first
/// [`HANDOFFS_TIMED`].
async fn chain<Q, G>(
    waiters: usize,
    mut queue_one: impl FnMut(usize) -> Q,
    queued: impl std::future::Future<Output = ()>,
    release: impl std::future::Future<Output = ()>,
) -> Samples
where
    Q: std::future::Future<Output = G>,
    G: std::future::Future<Output = Turn> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..waiters {
        let turn = queue_one(i).await;
        let tx = tx.clone();
        tokio::spawn(async move {
            let _ = tx.send(turn.await);
        });
    }
    drop(tx);
    queued.await;
    let mut turns = Vec::with_capacity(waiters);
    let released_at = Instant::now();
    release.await;
    while let Some(t) = rx.recv().await {
        turns.push(t);
    }
    turns.sort_by_key(|(granted, _)| *granted);
    let mut samples = Samples::new();
    let mut previous_release = released_at;
    for (granted, released) in turns.into_iter().take(HANDOFFS_TIMED) {
        samples.record(granted.saturating_duration_since(previous_release));
        previous_release = released;
    }
    samples
}

/// Ours: `waiters` sessions queued behind a holder. `session` opens one session.
#[allow(clippy::async_yields_async)] // each waiter's future yields the future of its turn
pub async fn handoff_ours<F, Fut>(waiters: usize, name: &str, session: F) -> HandoffRow
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Session>,
{
    let holder = session().await;
    let g = holder.mutex(name).unwrap().lock().await.unwrap();
    let mut sessions = Vec::new();
    for _ in 0..waiters {
        sessions.push(session().await);
    }
    let sessions = Arc::new(sessions);
    let samples = chain(
        waiters,
        |i| {
            let s = sessions[i].clone();
            let name = name.to_string();
            async move {
                let m = s.mutex(&name).unwrap();
                let turn = tokio::spawn(async move {
                    let g = m.lock().await.unwrap();
                    let granted = Instant::now();
                    g.release().await.unwrap();
                    (granted, granted)
                });
                async move { turn.await.unwrap() }
            }
        },
        {
            // The lock's own queue, not `list_entries` (the whole namespace: after the held
            // rows, up to a million parent nodes on ZooKeeper that the server has not reaped
            // yet, whose listing held the holder's heartbeat behind it past the TTL).
            let queued = holder.mutex(name).unwrap();
            async move {
                while queued.waiters().await.unwrap().len() < waiters {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        },
        async move { g.release().await.unwrap() },
    )
    .await;
    for s in sessions.iter() {
        let _ = s.close().await;
    }
    HandoffRow {
        implementation: "fencelock Mutex".into(),
        waiters,
        samples,
    }
}

/// etcd-client's `lock()`: `waiters` leases (sessions) waiting on one name behind a holder.
#[allow(clippy::async_yields_async)] // each waiter's future yields the future of its turn
pub async fn handoff_etcd_client(endpoint: &str, waiters: usize, name: &str) -> HandoffRow {
    let client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let lease = |c: etcd_client::Client| async move {
        c.lease_client().grant(300, None).await.unwrap().id()
    };
    let holder_lease = lease(client.clone()).await;
    let mut c = client.clone();
    let held = c
        .lock(
            name,
            Some(etcd_client::LockOptions::new().with_lease(holder_lease)),
        )
        .await
        .unwrap()
        .key()
        .to_vec();
    let mut leases = Vec::new();
    for _ in 0..waiters {
        leases.push(lease(client.clone()).await);
    }
    let prefix = format!("{name}/");
    let samples = chain(
        waiters,
        |i| {
            let (mut c, lease, name) = (client.clone(), leases[i], name.to_string());
            async move {
                let turn = tokio::spawn(async move {
                    let opts = etcd_client::LockOptions::new().with_lease(lease);
                    let key = c
                        .lock(name.as_str(), Some(opts))
                        .await
                        .unwrap()
                        .key()
                        .to_vec();
                    let granted = Instant::now();
                    c.unlock(key).await.unwrap();
                    (granted, granted)
                });
                async move { turn.await.unwrap() }
            }
        },
        {
            let mut c = client.clone();
            async move {
                let want = waiters as i64 + 1;
                loop {
                    let n = c
                        .get(
                            prefix.as_str(),
                            Some(
                                etcd_client::GetOptions::new()
                                    .with_prefix()
                                    .with_count_only(),
                            ),
                        )
                        .await
                        .unwrap()
                        .count();
                    if n >= want {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        },
        {
            let mut c = client.clone();
            async move {
                c.unlock(held).await.unwrap();
            }
        },
    )
    .await;
    let lc = client.lease_client();
    for l in leases.into_iter().chain([holder_lease]) {
        let _ = lc.clone().revoke(l).await;
    }
    HandoffRow {
        implementation: "etcd-client lock()".into(),
        waiters,
        samples,
    }
}

/// zookeeper-client's lock recipe: `waiters` clients (sessions) waiting on one directory.
#[allow(clippy::async_yields_async)] // each waiter's future yields the future of its turn
pub async fn handoff_zk_recipe(connect: &str, waiters: usize, dir: &str) -> HandoffRow {
    let connect_one = || async {
        zk::Client::connector()
            .with_session_timeout(Duration::from_secs(30))
            .connect(connect)
            .await
            .unwrap()
    };
    let lock = |c: zk::Client, dir: String| async move {
        let prefix = zk::LockPrefix::new_curator(&dir, "lock-").unwrap();
        let options = zk::LockOptions::new(zk::Acls::anyone_all())
            .with_ancestor_options(zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()))
            .unwrap();
        c.lock(prefix, b"", options).await.unwrap().into_owned()
    };
    let holder = connect_one().await;
    let held = lock(holder.clone(), dir.to_string()).await;
    let mut clients = Vec::new();
    for _ in 0..waiters {
        clients.push(connect_one().await);
    }
    let samples = chain(
        waiters,
        |i| {
            let (c, dir) = (clients[i].clone(), dir.to_string());
            async move {
                let turn = tokio::spawn(async move {
                    let l = lock(c, dir).await;
                    let granted = Instant::now();
                    l.delete(l.lock_path(), None).await.unwrap();
                    std::mem::forget(l);
                    (granted, granted)
                });
                async move { turn.await.unwrap() }
            }
        },
        {
            let (holder, dir) = (holder.clone(), dir.to_string());
            async move {
                while holder.list_children(&dir).await.map_or(0, |c| c.len()) < waiters + 1 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        },
        async move {
            held.delete(held.lock_path(), None).await.unwrap();
            std::mem::forget(held);
        },
    )
    .await;
    HandoffRow {
        implementation: "zookeeper-client Client::lock".into(),
        waiters,
        samples,
    }
}

/// How many chains of `waiters` to run for about [`HANDOFFS_TIMED`] handoffs (short queues
/// give few each).
fn repetitions(waiters: usize) -> usize {
    HANDOFFS_TIMED.div_ceil(waiters.max(1)).min(25)
}

/// The rows of several chains of one implementation, as one.
fn merged(rows: Vec<HandoffRow>) -> HandoffRow {
    let mut it = rows.into_iter();
    let mut first = it.next().expect("a row");
    for r in it {
        first.samples.merge(&r.samples);
    }
    first
}

/// Repetitions of each held-locks row (the table prints their median and spread).
pub const HELD_REPS: usize = 5;

/// The median of `values` (sorted in place), and their least and greatest.
fn median_spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (median, values[0], values[n - 1])
}

/// One row per implementation and count: each a set of repetitions of the same measurement.
fn held_table(backend: &str, rows: &[Vec<HeldRow>]) {
    crate::emit!(
        "\n{backend}: one session takes N distinct locks, new to the server ({IN_FLIGHT} in flight), holds them, then releases them all; the median of {HELD_REPS} repetitions side by side, their least and greatest in parentheses:\n"
    );
    crate::emit!("| implementation | locks | acquisitions/s | releases/s | client bytes per held lock | server watches added while held |");
    crate::emit!("|---|---:|---:|---:|---:|---:|");
    let rate_id = format!("{}-held-rate", backend.to_lowercase());
    let mem_id = format!("{}-held-memory", backend.to_lowercase());
    super::report::define(
        &rate_id,
        &format!("{backend}: acquiring N distinct locks"),
        "locks held (N)",
        "acquisitions/s",
        true,
    );
    super::report::define(
        &mem_id,
        &format!("{backend}: client memory per held lock"),
        "locks held (N)",
        "bytes per lock",
        true,
    );
    for reps in rows.iter().filter(|r| !r.is_empty()) {
        let first = &reps[0];
        let mut rates: Vec<f64> = reps.iter().filter_map(|r| r.rate).collect();
        let rate = (!rates.is_empty()).then(|| median_spread(&mut rates));
        let (release, release_min, release_max) =
            median_spread(&mut reps.iter().map(|r| r.release_rate).collect::<Vec<_>>());
        let mut bytes: Vec<f64> = reps.iter().filter_map(|r| r.bytes_per_lock).collect();
        let bytes = (!bytes.is_empty()).then(|| median_spread(&mut bytes).0);
        let watches = reps.iter().filter_map(|r| r.server_watches).max();
        let rate_cell = rate.map_or("—".to_string(), |(rate, min, max)| {
            format!("{rate:.0} ({min:.0}–{max:.0})")
        });
        crate::emit!(
            "| {} | {} | {rate_cell} | {release:.0} ({release_min:.0}–{release_max:.0}) | {} | {} |",
            first.implementation,
            first.locks,
            bytes.map_or("n/a".into(), |b| format!("{b:.0}")),
            watches.map_or("n/a".into(), |w| w.to_string()),
        );
        if let Some((rate, ..)) = rate {
            super::report::point(&rate_id, &first.implementation, first.locks as f64, rate);
        }
        if let Some(b) = bytes {
            super::report::point(&mem_id, &first.implementation, first.locks as f64, b);
        }
    }
}

fn handoff_table(backend: &str, rows: &[HandoffRow]) {
    crate::emit!(
        "\n{backend}: handoff latency against the queue's length: from a holder's release call to the next grant (each waiter its own session, releasing at once when granted; the first {HANDOFFS_TIMED} handoffs of each chain, chains repeated for short queues):\n"
    );
    crate::emit!(
        "| implementation | waiters | handoffs timed | handoff p50 ms | p99 ms | p50 vs 1 waiter |"
    );
    crate::emit!("|---|---:|---:|---:|---:|---:|");
    let id = format!("{}-handoff", backend.to_lowercase());
    super::report::define_with(
        &id,
        &format!("{backend}: handoff p50 against waiters"),
        "waiters",
        "handoff p50 (ms, log scale)",
        true,
        true,
    );
    for r in rows {
        let base = rows
            .iter()
            .find(|b| b.implementation == r.implementation && b.waiters == 1)
            .map(|b| b.samples.pct(0.5).as_secs_f64());
        let p50 = r.samples.pct(0.5);
        let ratio = base.map_or("".into(), |b| format!("{:.2}x", p50.as_secs_f64() / b));
        crate::emit!(
            "| {} | {} | {} | {} | {} | {ratio} |",
            r.implementation,
            r.waiters,
            r.samples.len(),
            super::ms(p50),
            super::ms(r.samples.pct(0.99))
        );
        super::report::point(
            &id,
            &r.implementation,
            r.waiters as f64,
            p50.as_secs_f64() * 1e3,
        );
    }
}

/// The scale rows of one backend: ours (sessions of `backend`) next to a peer, whose held-locks
/// row for `n` locks and handoff row for `w` waiters (repetition `r`) the closures measure.
#[allow(clippy::too_many_arguments)]
async fn scale_rows<H, HF, O, OF>(
    label: &str,
    kind: Kind,
    backend: Arc<dyn fencelock::backend::Backend>,
    endpoint: &str,
    zk_port: Option<u16>,
    held: &[usize],
    waiters: &[usize],
    peer_held: H,
    peer_handoff: O,
) where
    H: Fn(usize, usize) -> HF,
    HF: std::future::Future<Output = Vec<HeldRow>>,
    O: Fn(usize, usize) -> OF,
    OF: std::future::Future<Output = HandoffRow>,
{
    let session = || {
        let b = backend.clone();
        async move {
            Session::builder(b)
                .namespace("bench-scale")
                .ttl(Duration::from_secs(30))
                .start()
                .await
                .unwrap()
        }
    };
    let mut rows = Vec::new();
    for &n in held {
        // Side by side, repetition by repetition, on names new to the server each time.
        // Ours, then each of the peers' rows (the recipe, and on etcd the raw requests).
        let mut reps: Vec<Vec<HeldRow>> = Vec::new();
        for rep in 0..HELD_REPS {
            let ours = held_ours(kind, endpoint, zk_port, session().await, n, rep).await;
            let all = std::iter::once(ours).chain(peer_held(n, rep).await);
            for (i, row) in all.enumerate() {
                if reps.len() <= i {
                    reps.push(Vec::new());
                }
                reps[i].push(row);
            }
        }
        rows.extend(reps);
    }
    held_table(label, &rows);
    let mut rows = Vec::new();
    for &w in waiters {
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for r in 0..repetitions(w) {
            ours.push(handoff_ours(w, &format!("handoff-{w}-{r}"), session).await);
            theirs.push(peer_handoff(w, r).await);
        }
        rows.push(merged(ours));
        rows.push(merged(theirs));
    }
    handoff_table(label, &rows);
    let n = waiters.iter().copied().max().unwrap_or(1000);
    sessions_row(label, n, Duration::from_secs(3), |ttl| {
        let b = backend.clone();
        async move { Session::builder(b).ttl(ttl).start().await.unwrap() }
    })
    .await;
}

/// The scale rows on etcd (member at `ep`), ours next to etcd-client's `lock()`.
pub async fn etcd_scale(held: &[usize], waiters: &[usize], ep: &str) {
    let backend = fencelock_integration::servers::etcd::connect(&[ep.to_string()]).await;
    scale_rows(
        "etcd",
        Kind::Etcd,
        Arc::new(backend),
        ep,
        None,
        held,
        waiters,
        |n, rep| async move {
            vec![
                held_etcd_client(ep, n, rep).await,
                held_etcd_raw(ep, n, rep, false).await,
                held_etcd_raw(ep, n, rep, true).await,
            ]
        },
        |w, r| async move {
            handoff_etcd_client(ep, w, &format!("bench/peer-handoff-{w}-{r}")).await
        },
    )
    .await;
}

/// The scale rows on ZooKeeper (server at `connect`, four-letter words on `port`), ours next to
/// zookeeper-client's lock recipe.
pub async fn zookeeper_scale(held: &[usize], waiters: &[usize], connect: &str, port: u16) {
    let backend = fencelock_zookeeper::ZooKeeperBackend::builder(connect)
        .connect()
        .await
        .unwrap();
    scale_rows(
        "ZooKeeper",
        Kind::ZooKeeper,
        Arc::new(backend),
        connect,
        Some(port),
        held,
        waiters,
        |n, rep| async move { vec![held_zk_recipe(connect, port, n, rep).await] },
        |w, r| async move {
            handoff_zk_recipe(connect, w, &format!("/bench/peer-handoff-{w}-{r}")).await
        },
    )
    .await;
}

/// `n` sessions open in this process, idle for two TTLs: how many stay live, and the client
/// memory each costs.
pub async fn sessions_row<F, Fut>(backend_name: &str, n: usize, ttl: Duration, session: F)
where
    F: Fn(Duration) -> Fut,
    Fut: std::future::Future<Output = Session>,
{
    let before = allocated();
    let start = Instant::now();
    let mut sessions = Vec::with_capacity(n);
    for _ in 0..n {
        sessions.push(session(ttl).await);
    }
    let opened = start.elapsed();
    let bytes = per_lock(before, allocated(), n);
    tokio::time::sleep(ttl * 2).await;
    let live = sessions
        .iter()
        .filter(|s| s.state() == fencelock::SessionState::Live)
        .count();
    crate::emit!(
        "\n{backend_name}: {n} sessions in one process (TTL {ttl:?}), idle for two TTLs:\n"
    );
    crate::emit!("| sessions | opened in | live after 2 TTL | client bytes per session |");
    crate::emit!("|---:|---:|---:|---:|");
    crate::emit!(
        "| {n} | {:.1} s | {live} | {} |",
        opened.as_secs_f64(),
        bytes.map_or("n/a".into(), |b| format!("{b:.0}"))
    );
    for s in sessions {
        let _ = s.close().await;
    }
}
