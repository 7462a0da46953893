//! The benchmark: prints tables comparing fencelock with its peers side by side, in one run,
//! against the same local servers (started by the harness). Not a timed test: figures on a
//! shared machine are noisy, so compare the rows of one run, and read the ratios.
//!
//! Run: `cargo run --release -p fencelock-integration --bin bench -- --help`

use clap::Parser;
use fencelock_integration::bench::etcd::{etcd_campaign_row, etcd_family, etcd_rows};
use fencelock_integration::bench::{election_header, election_rows, Args};
use fencelock_integration::servers::etcd::{self as etcd_harness, EtcdCluster};
use fencelock_integration::servers::Cluster;

#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("holder") {
        // Child mode for the failover rows: `bench holder hold ...`, as the holder binary.
        fencelock_integration::holder::run(argv.into_iter().skip(1)).await;
        return;
    }
    let args = Args::parse();
    println!("# fencelock benchmark");
    println!("\nOne run, side by side, against servers started here on loopback.");
    if matches!(args.backend.as_str(), "etcd" | "all") {
        if etcd_harness::missing().is_none() {
            let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
                .await
                .expect("start etcd");
            if !args.family_only {
                etcd_rows(&args, &cluster).await;
            }
            etcd_family(&args, &cluster).await;
            if !args.family_only {
                election_header("etcd");
                election_rows(args.rounds, args.failovers, &cluster.target()).await;
                etcd_campaign_row(&args, &cluster.endpoint(0)).await;
            }
        } else {
            println!("\n(etcd not installed: skipped)");
        }
    }
    if matches!(args.backend.as_str(), "zookeeper" | "all") {
        fencelock_integration::bench::zookeeper::zookeeper_rows(&args).await;
    }
}
