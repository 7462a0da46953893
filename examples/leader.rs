//! A leader-elected service: it campaigns, stamps every write with its epoch, steps down the
//! moment its leadership is lost, takes part again after a session loss, and resigns at once on
//! ctrl-c or SIGTERM so that another instance takes over in milliseconds.
//!
//! On a real cluster, run two instances and stop the leader:
//!
//! ```text
//! cargo run -p fencelock-examples --example leader -- --etcd 127.0.0.1:2379 --name node-a
//! cargo run -p fencelock-examples --example leader -- --etcd 127.0.0.1:2379 --name node-b
//! ```
//!
//! ctrl-c on the leader hands over at once; `kill -9` of the leader hands over after the TTL.
//! `--zookeeper 127.0.0.1:2181` works the same. Without a cluster, two nodes run in this process
//! on the in-memory backend.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use fencelock::{Fence, Session, Supervisor};
use fencelock_examples::{shutdown_signal, BackendArgs};
use futures_util::StreamExt;

#[derive(Parser, Debug)]
#[command(about = "A leader-elected service on fencelock")]
struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// This instance's name (published as the leader's value).
    #[arg(long, default_value = "node-a")]
    name: String,
    /// The election.
    #[arg(long, default_value = "orders-primary")]
    election: String,
    /// The session TTL (a killed leader is replaced after about this long).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// How often the leader does its work.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    every: Duration,
}

#[tokio::main]
async fn main() -> fencelock::Result<()> {
    let args = Args::parse();
    let (backend, what) = args.backend.connect().await?;
    if !args.backend.is_remote() {
        return demo(backend, &args).await;
    }
    println!(
        "{}: campaigning for {:?} on {what} (ttl {:?}); ctrl-c or SIGTERM to stop",
        args.name, args.election, args.ttl
    );
    // A stand-in for the shared storage: this process's own fence, which checks this
    // instance's writes only. Real storage shared by the instances keeps the fence (see the
    // `fenced_sql` example, and `leader_state` for state kept in the cluster itself).
    serve(backend, &args, Arc::new(Fence::new())).await
}

/// One instance of the service until a shutdown signal.
async fn serve(
    backend: Arc<dyn fencelock::backend::Backend>,
    args: &Args,
    storage: Arc<Fence>,
) -> fencelock::Result<()> {
    let builder = Session::builder(backend).ttl(args.ttl);
    let name = args.name.clone();
    let shutdown = {
        let name = name.clone();
        async move {
            let signal = shutdown_signal().await;
            println!("{name}: {signal}: shutting down, resigning");
        }
    };
    Supervisor::new(builder)
        .lead(&args.election, name.as_bytes(), shutdown, |leader| {
            let (name, storage, every) = (name.clone(), storage.clone(), args.every);
            async move {
                let epoch = leader.epoch();
                println!("{name}: leading, epoch {epoch}");
                let mut states = Box::pin(leader.session().state_changes());
                let mut tick = tokio::time::interval(every);
                loop {
                    tokio::select! {
                        Some(state) = states.next() => println!("{name}: session {state:?}"),
                        _ = tick.tick() => match storage.admit(epoch) {
                            Ok(()) => println!("{name}: wrote as leader, epoch {epoch}"),
                            Err(e) => println!("{name}: write refused: {e}"),
                        },
                    }
                }
            }
        })
        .await?;
    println!("{name}: stopped");
    Ok(())
}

/// Two nodes in this process on the in-memory backend: node-a leads, then resigns; node-b takes
/// over with a larger epoch, and the storage refuses node-a's late write.
async fn demo(backend: Arc<dyn fencelock::backend::Backend>, args: &Args) -> fencelock::Result<()> {
    let storage = Fence::new();
    let a = Session::builder(backend.clone())
        .ttl(args.ttl)
        .start()
        .await?;
    let b = Session::builder(backend).ttl(args.ttl).start().await?;
    let leader_a = a.election(&args.election)?.campaign(b"node-a").await?;
    println!("node-a: leading, epoch {}", leader_a.epoch());
    storage.admit(leader_a.epoch())?;
    let election_b = b.election(&args.election)?;
    let node_b = tokio::spawn(async move { election_b.campaign(b"node-b").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!("node-a: resigning");
    let stale = leader_a.epoch();
    leader_a.resign().await?;
    let leader_b = node_b.await.expect("node-b")?;
    println!("node-b: leading, epoch {}", leader_b.epoch());
    storage.admit(leader_b.epoch())?;
    match storage.admit(stale) {
        Err(e) => println!("storage: refused node-a's late write: {e}"),
        Ok(()) => unreachable!("a deposed leader's write must be refused"),
    }
    leader_b.resign().await?;
    Ok(())
}
