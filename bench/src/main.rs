//! The benchmark: prints tables comparing fencelock with its peers side by side, in one run,
//! against the same local servers (started by the harness). Not a timed test: figures on a
//! shared machine are noisy, so compare the rows of one run, and read the ratios.
//!
//! Run: `cargo run --release -p fencelock-bench -- --help`

use clap::Parser;
use fencelock_bench::alloc::Counting;
use fencelock_bench::etcd::{campaign_ratio, etcd_campaign_row, etcd_family, etcd_rows};
use fencelock_bench::{election_header, election_rows, Args};
use fencelock_integration::servers::etcd::{self as etcd_harness, EtcdCluster};
use fencelock_integration::servers::Cluster;

/// Counts live heap bytes, for the held-locks rows' memory per lock.
#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("holder") {
        // Child mode for the failover rows: `bench holder hold ...`, as the holder binary.
        fencelock_integration::holder::run(argv.into_iter().skip(1)).await;
        return;
    }
    let args = Args::parse();
    fencelock_bench::emit!("# fencelock benchmark");
    fencelock_bench::emit!("\nOne run, side by side, against servers started here on loopback.");
    if args.gray_only {
        fencelock_bench::gray::gray_rows(&args).await;
        finish(&args);
        return;
    }
    if matches!(args.backend.as_str(), "etcd" | "all") {
        if etcd_harness::missing().is_none() {
            let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
                .await
                .expect("start etcd");
            if !args.family_only && !args.scale_only {
                etcd_rows(&args, &cluster).await;
            }
            if !args.scale_only && !args.contended_only {
                etcd_family(&args, &cluster).await;
            }
            if !args.family_only && !args.scale_only && !args.contended_only {
                election_header("etcd");
                election_rows(args.rounds, args.failovers, &cluster.target()).await;
                let side_by_side = etcd_campaign_row(&args, &cluster.endpoint(0)).await;
                campaign_ratio(&side_by_side);
            }
            if !args.family_only && !args.no_scale && !args.contended_only {
                fencelock_bench::scale::etcd_scale(&args.held, &args.waiters, &cluster.endpoint(0))
                    .await;
            }
        } else {
            fencelock_bench::emit!("\n(etcd not installed: skipped)");
        }
    }
    if matches!(args.backend.as_str(), "zookeeper" | "all") {
        fencelock_bench::zookeeper::zookeeper_rows(&args).await;
    }
    let redis = !args.family_only && !args.scale_only && !args.contended_only;
    if matches!(args.backend.as_str(), "redis" | "all") && redis {
        fencelock_bench::redis::redis_rows(&args).await;
        if !args.no_cluster {
            fencelock_bench::redis_cluster::redis_cluster_rows(&args).await;
        }
    }
    fencelock_bench::emit_summary();
    if !args.no_gray && !args.family_only && !args.scale_only && !args.contended_only {
        fencelock_bench::gray::gray_rows(&args).await;
    }
    finish(&args);
}

/// Writes the report, if asked for.
fn finish(args: &Args) {
    if let Some(dir) = &args.report {
        let command = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
        let command = format!("cargo run --release -p fencelock-bench -- {command}");
        match fencelock_bench::report::write(dir, &command) {
            Ok(()) => println!("\nreport written to {}", dir.join("README.md").display()),
            Err(e) => {
                eprintln!("cannot write the report: {e}");
                std::process::exit(1);
            }
        }
    }
}
