//! The benchmark: prints tables comparing fencelock with its peers side by side, in one run,
//! against the same local servers (started by the harness). Not a timed test: figures on a
//! shared machine are noisy, so compare the rows of one run, and read the ratios.
//!
//! Run: `cargo run --release -p fencelock-integration --bin bench -- --help`

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use fencelock::Session;
use fencelock_etcd::EtcdBackend;
use fencelock_integration::bench_util::{
    election_header, election_row, election_rows, ms, throughput_pair, time_interleaved, Op,
    Samples,
};
use fencelock_integration::etcd::{self as etcd_harness, EtcdServer};
use fencelock_integration::faults::{Kind, Target};

#[derive(Parser, Debug, Clone)]
#[command(about = "fencelock benchmark: latency and throughput side by side with the peers")]
struct Args {
    /// Which backends to measure: etcd, zookeeper or all.
    #[arg(long, default_value = "all")]
    backend: String,
    /// Uncontended acquire+release rounds per row.
    #[arg(long, default_value_t = 500)]
    rounds: usize,
    /// Seconds of each contended throughput measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Failover repetitions per row (each takes about a TTL when killed).
    #[arg(long, default_value_t = 3)]
    failovers: usize,
    /// Contending session counts.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 4, 16])]
    sessions: Vec<usize>,
}

/// Times `rounds` runs of `op`, after a short warm-up.
async fn time_rounds<F, Fut>(rounds: usize, mut op: F) -> Samples
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..rounds / 10 + 1 {
        op().await;
    }
    let mut v = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        op().await;
        v.push(t.elapsed());
    }
    Samples(v)
}

async fn etcd_rows(args: &Args, server: &EtcdServer) {
    let ep = server.endpoint();
    let backend = etcd_harness::connect(&ep).await;
    println!("\n## etcd (single member, {ep})\n");
    println!(
        "Uncontended acquire + release, {} rounds (interleaved in blocks of 50):\n",
        args.rounds
    );
    println!("| implementation | p50 ms | p99 ms | p50 vs raw txn |");
    println!("|---|---:|---:|---:|");

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
    let mut ops = [ours, raw, recipe];
    let samples = time_interleaved(args.rounds, &mut ops).await;
    let (ours, raw, recipe) = (&samples[0], &samples[1], &samples[2]);
    let base = raw.pct(0.5);
    for (name, s) in [
        ("fencelock Mutex lock + release", ours),
        ("raw txn create + delete", raw),
        ("etcd-client lock() + unlock()", recipe),
    ] {
        println!(
            "| {name} | {} | {} | {:.2}x |",
            ms(s.pct(0.5)),
            ms(s.pct(0.99)),
            s.pct(0.5).as_secs_f64() / base.as_secs_f64()
        );
    }
    session.close().await.unwrap();

    println!(
        "\nContended acquisitions per second ({} s each, one connection per session, alternating in slices):\n",
        args.seconds
    );
    println!("| sessions | fencelock Mutex | etcd-client lock() | ratio |");
    println!("|---:|---:|---:|---:|");
    for &n in &args.sessions {
        let mut ours_ops = Vec::new();
        let mut their_ops = Vec::new();
        for _ in 0..n {
            let b = EtcdBackend::connect([ep.as_str()]).await.unwrap();
            let s = Session::builder(b)
                .namespace("bench")
                .start()
                .await
                .unwrap();
            let m = Arc::new(s.mutex("contended").unwrap());
            let op: Op = Box::new(move || {
                let (m, _s) = (m.clone(), s.clone());
                Box::pin(async move {
                    let g = m.lock().await.unwrap();
                    g.release().await.unwrap();
                })
            });
            ours_ops.push(op);
            let mut c = etcd_client::Client::connect([ep.as_str()], None)
                .await
                .unwrap();
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
        let (ours, theirs) = throughput_pair(ours_ops, their_ops, args.seconds).await;
        println!("| {n} | {ours:.0} | {theirs:.0} | {:.2}x |", ours / theirs);
    }
}

/// etcd's own server-side Campaign API through etcd-client, the same measurements.
async fn etcd_campaign_row(args: &Args, ep: &str) {
    use etcd_client::{Client, ResignOptions};
    let mut c = Client::connect([ep], None).await.unwrap();
    let lease = c.lease_grant(10, None).await.unwrap().id();
    let lat = time_rounds(args.rounds / 2, || {
        let mut c = c.clone();
        async move {
            let r = c.campaign("bench-campaign/lat", "v", lease).await.unwrap();
            let key = r.leader().unwrap().clone();
            c.resign(Some(ResignOptions::new().with_leader(key)))
                .await
                .unwrap();
        }
    })
    .await;
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
}

#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("holder") {
        // Child mode for the failover rows.
        fencelock_integration::faults::run_holder(&argv[2..]).await;
        return;
    }
    let args = Args::parse();
    println!("# fencelock benchmark");
    println!("\nOne run, side by side, against servers started here on loopback.");
    if matches!(args.backend.as_str(), "etcd" | "all") {
        match etcd_harness::installed() {
            true => {
                let server = EtcdServer::start();
                etcd_rows(&args, &server).await;
                let t = Target {
                    kind: Kind::Etcd,
                    endpoint: server.endpoint(),
                };
                election_header("etcd");
                election_rows(args.rounds, args.failovers, &t).await;
                etcd_campaign_row(&args, &server.endpoint()).await;
            }
            false => println!("\n(etcd not installed: skipped)"),
        }
    }
    if matches!(args.backend.as_str(), "zookeeper" | "all") {
        fencelock_integration::bench_zk::zookeeper_rows(
            args.rounds,
            args.seconds,
            &args.sessions,
            args.failovers,
        )
        .await;
    }
}
