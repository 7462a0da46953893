//! The etcd rows of the benchmark (`src/main.rs`), side by side in one run against one
//! local member started here: our `Mutex` against raw transactions and etcd-client's `lock()`,
//! uncontended and contended, and etcd's own Campaign API next to our election rows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::Session;
use fencelock_etcd::EtcdBackend;

use super::{election_row, ms, throughput_pair, time_interleaved, Args, Op};
use fencelock_integration::servers::etcd::{self as etcd_harness, EtcdCluster};
use fencelock_integration::servers::Cluster;

/// Prints the etcd rows (markdown tables): uncontended latency of `args.rounds` acquire +
/// release, and contended throughput for each count of `args.sessions`.
pub async fn etcd_rows(args: &Args, cluster: &EtcdCluster) {
    let ep = cluster.endpoint(0);
    if args.contended_only {
        crate::emit!("\n## etcd (single member, {ep})\n");
        return etcd_contended_rows(args, &ep).await;
    }
    let backend = etcd_harness::connect(std::slice::from_ref(&ep)).await;
    crate::emit!("\n## etcd (single member, {ep})\n");
    crate::emit!(
        "Uncontended acquire + release, {} rounds (interleaved in blocks of 50):\n",
        args.rounds
    );
    super::latency_header("raw txn");

    // Raw: txn create-if-absent with a lease, then delete.
    let mut client = backend.client().clone();
    let lease = client.lease_grant(60, None).await.unwrap().id();
    let c = client.clone();
    let raw: Op = Box::new(move || {
        let mut c = c.clone();
        Box::pin(async move {
            use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
            let key = format!("bench/raw/{lease:x}");
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            c.txn(txn).await.unwrap();
            c.delete(key, None).await.unwrap();
        })
    });
    // Raw, with our requests' shape: the enqueue txn (create if absent, and the sorted range
    // read of the nearest entry ahead) and the guarded delete. Next to ours, it tells the
    // requests' cost from the library's.
    let c = client.clone();
    let raw_ours: Op = Box::new(move || {
        let mut c = c.clone();
        Box::pin(async move {
            use etcd_client::{
                Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
            };
            let prefix = "bench/raw-shaped/";
            let key = format!("{prefix}{lease:x}");
            let read = TxnOp::get(
                prefix,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(2),
                ),
            );
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key.as_str(), "", Some(PutOptions::new().with_lease(lease))),
                    read,
                ]);
            let rev = c.txn(txn).await.unwrap().header().unwrap().revision();
            let release = Txn::new()
                .when([Compare::create_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    rev,
                )])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            c.txn(release).await.unwrap();
        })
    });
    let session = Session::builder(backend.clone())
        .namespace("bench")
        .start()
        .await
        .unwrap();
    let mutex = Arc::new(session.mutex("ours").unwrap());
    let ours: Op = Box::new(move || {
        let m = mutex.clone();
        Box::pin(async move {
            let g = m.lock().await.unwrap();
            g.release().await.unwrap();
        })
    });
    let c = client.clone();
    let recipe: Op = Box::new(move || {
        let mut c = c.clone();
        Box::pin(async move {
            let opts = etcd_client::LockOptions::new().with_lease(lease);
            let key = c
                .lock("bench/etcd-lock", Some(opts))
                .await
                .unwrap()
                .key()
                .to_vec();
            c.unlock(key).await.unwrap();
        })
    });
    // Interleaved in blocks, so that drift on the machine hits every row alike.
    let mut ops = [ours, raw, recipe, raw_ours];
    let samples = time_interleaved(args.rounds, &mut ops).await;
    super::latency_rows(
        &[
            "fencelock Mutex lock + release",
            "raw txn create + delete",
            "etcd-client lock() + unlock()",
            "raw, our requests' shape (enqueue txn + guarded delete)",
        ],
        &samples,
        1,
    );
    super::summary("etcd", "uncontended p50 ms", ms(samples[0].pct(0.5)));
    session.close().await.unwrap();
    etcd_contended_rows(args, &ep).await;
}

/// Prints the etcd contended rows: acquisitions per second for each count of
/// `args.sessions`, ours and etcd-client's `lock()`, then the share of the handoff limit.
pub async fn etcd_contended_rows(args: &Args, ep: &str) {
    crate::emit!(
        "\nContended acquisitions per second ({} s each, in {} alternating pairs of slices, one connection per session):\n",
        args.seconds,
        super::PAIRS
    );
    crate::emit!(
        "(in parentheses: the least-served session's acquisitions as a share of the most-served one's, 1.00 all alike)\n"
    );
    crate::emit!("| sessions | fencelock Mutex | etcd-client lock() | ratio: median of the pairs (least–greatest) |");
    crate::emit!("|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for &n in &args.sessions {
        let mut ours_ops = Vec::new();
        let mut their_ops = Vec::new();
        for _ in 0..n {
            let s = bench_session(ep).await;
            let m = Arc::new(s.mutex("contended").unwrap());
            let op: Op = Box::new(move || {
                let (m, _s) = (m.clone(), s.clone());
                Box::pin(async move {
                    let g = m.lock().await.unwrap();
                    g.release().await.unwrap();
                })
            });
            ours_ops.push(op);
            let mut c = etcd_client::Client::connect([ep], None).await.unwrap();
            let lease = c.lease_grant(60, None).await.unwrap().id();
            let op: Op = Box::new(move || {
                let mut c = c.clone();
                Box::pin(async move {
                    let opts = etcd_client::LockOptions::new().with_lease(lease);
                    let key = c
                        .lock("bench/etcd-contended", Some(opts))
                        .await
                        .unwrap()
                        .key()
                        .to_vec();
                    c.unlock(key).await.unwrap();
                })
            });
            their_ops.push(op);
        }
        let pair = throughput_pair(ours_ops, their_ops, args.seconds).await;
        let (ours, theirs) = super::contended_row(n, &pair);
        rows.push((n, pair));
        super::summary("etcd", &format!("{n} sessions acq/s"), format!("{ours:.0}"));
        super::report::define(
            "etcd-throughput",
            "etcd: contended acquisitions per second",
            "contending sessions",
            "acquisitions/s",
            true,
        );
        super::report::point("etcd-throughput", "fencelock Mutex", n as f64, ours);
        super::report::point("etcd-throughput", "etcd-client lock()", n as f64, theirs);
    }
    let mut limits = Vec::new();
    for _ in 0..super::PAIRS {
        limits.push(super::pingpong::etcd(ep, args.seconds / super::PAIRS as f64).await);
    }
    super::limit_rows("etcd-client lock()", &limits, &rows);
}

/// A session of its own (a connection of its own) on the member at `ep`, in namespace `bench`.
async fn bench_session(ep: &str) -> Session {
    let b = EtcdBackend::connect([ep]).await.unwrap();
    Session::builder(b)
        .namespace("bench")
        .start()
        .await
        .unwrap()
}

/// Prints the lock family's rows on etcd (see [`super::family`]).
pub async fn etcd_family(args: &Args, cluster: &EtcdCluster) {
    let ep = cluster.endpoint(0);
    let e = ep.clone();
    super::family::etcd_family_rows(args.seconds, &ep, move || {
        let e = e.clone();
        Box::pin(async move { bench_session(&e).await })
    })
    .await;
}

/// etcd's own server-side Campaign API through etcd-client, the same measurements as the
/// election rows; its latency measured in blocks interleaved with our campaign's (a session of
/// its own), so that the two compare side by side (returned: ours and theirs, for
/// [`campaign_ratio`]).
pub async fn etcd_campaign_row(args: &Args, ep: &str) -> [super::Samples; 2] {
    use etcd_client::{Client, ResignOptions};
    let s = bench_session(ep).await;
    let e = Arc::new(s.election("lat-side-by-side").unwrap());
    let ours: Op = Box::new(move || {
        let e = e.clone();
        Box::pin(async move {
            let l = e.campaign(b"v").await.unwrap();
            l.resign().await.unwrap();
        })
    });
    let mut c = Client::connect([ep], None).await.unwrap();
    let lease = c.lease_grant(10, None).await.unwrap().id();
    let c2 = c.clone();
    let theirs: Op = Box::new(move || {
        let mut c = c2.clone();
        Box::pin(async move {
            let r = c.campaign("bench-campaign/lat", "v", lease).await.unwrap();
            let key = r.leader().unwrap().clone();
            c.resign(Some(ResignOptions::new().with_leader(key)))
                .await
                .unwrap();
        })
    });
    let mut both = [ours, theirs];
    let [ours, lat]: [super::Samples; 2] = time_interleaved((args.rounds / 2).max(1), &mut both)
        .await
        .try_into()
        .unwrap_or_else(|_| unreachable!("two ops, two samples"));
    s.close().await.unwrap();
    let mut closed = Vec::new();
    let mut killed = Vec::new();
    for i in 0..args.failovers * 2 {
        let kill = i % 2 == 1;
        let name = format!("bench-campaign/f{i}");
        let la = c.lease_grant(2, None).await.unwrap().id();
        // Keep the leader's lease alive until the "kill" (or the revoke).
        let (mut keeper, mut stream) = c.lease_client().keep_alive(la).await.unwrap();
        let keep = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if keeper.keep_alive().await.is_err() || stream.message().await.is_err() {
                    return;
                }
            }
        });
        c.campaign(name.as_str(), "a", la).await.unwrap();
        let lb = c.lease_grant(10, None).await.unwrap().id();
        let mut c2 = c.clone();
        let name2 = name.clone();
        let waiter = tokio::spawn(async move {
            c2.campaign(name2.as_str(), "b", lb).await.unwrap();
            Instant::now()
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t0 = Instant::now();
        keep.abort();
        if !kill {
            c.lease_revoke(la).await.unwrap();
        }
        let d = waiter.await.unwrap() - t0;
        if kill {
            killed.push(d)
        } else {
            closed.push(d)
        }
        let _ = c.lease_revoke(lb).await;
    }
    election_row("etcd Campaign API (etcd-client)", &lat, closed, killed);
    [ours, lat]
}

/// Prints our campaign's p50 against the Campaign API's, measured side by side (the election
/// rows above each come from a run of their own).
pub fn campaign_ratio([ours, theirs]: &[super::Samples; 2]) {
    let blocks: Vec<f64> = ours
        .1
        .iter()
        .zip(&theirs.1)
        .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
        .collect();
    crate::emit!(
        "\nCampaign + resign side by side (blocks of {} interleaved): fencelock p50 {} ms, the Campaign API's {} ms: {:.2}x (per block: {}).",
        super::BLOCK,
        ms(ours.pct(0.5)),
        ms(theirs.pct(0.5)),
        ours.pct(0.5).as_secs_f64() / theirs.pct(0.5).as_secs_f64(),
        super::spread(&blocks, "x")
    );
    super::summary(
        "etcd",
        "campaign p50 vs the Campaign API (side by side)",
        format!(
            "{:.2}x",
            ours.pct(0.5).as_secs_f64() / theirs.pct(0.5).as_secs_f64()
        ),
    );
}
