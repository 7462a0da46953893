//! A singleton cron job on many hosts: every instance wakes at each trigger time, and only the
//! one that takes the lock `cron:{job}:{trigger}` runs the job for that trigger. Run it on every
//! host; at most one run per trigger, whichever hosts are up.
//!
//! ```text
//! cargo run -p fencelock-examples --example cron -- --etcd 127.0.0.1:2379 \
//!     --job nightly-report --every 1m --name host-a --output /var/log/report-runs
//! ```
//!
//! Why at most once: an instance tries a trigger only within `--window` after it (a late one
//! skips it), and the winner holds the trigger's lock until twice the window has passed, so no
//! other instance can take it while it may still try. A winner that crashes keeps the lock
//! until its session expires (the TTL), past the window: the trigger is not run twice (nor
//! retried: at most once, not at least once). Each run records its trigger, host and fencing
//! token in `--output` (one line, appended). Without `--etcd` or `--zookeeper`, three instances
//! run in this process on the in-memory backend for a few triggers.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use fencelock::Session;
use fencelock_examples::{shutdown_signal, BackendArgs};

#[derive(Parser, Debug, Clone)]
#[command(about = "A singleton cron job on fencelock")]
struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// The job's name.
    #[arg(long, default_value = "report")]
    job: String,
    /// The schedule: a trigger at every multiple of this since the Unix epoch.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    every: Duration,
    /// How late after a trigger an instance may still take it.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    window: Duration,
    /// This instance's name.
    #[arg(long, default_value = "host")]
    name: String,
    /// Where each run is recorded (a line appended per run).
    #[arg(long)]
    output: Option<std::path::PathBuf>,
    /// Stop after this many triggers (0: run until interrupted).
    #[arg(long, default_value_t = 0)]
    triggers: u64,
    /// The locks' namespace.
    #[arg(long, default_value = fencelock::DEFAULT_NAMESPACE)]
    namespace: String,
    /// The session's TTL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ttl: Duration,
}

fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// The next trigger after now, in milliseconds since the epoch.
fn next_trigger(every: Duration) -> u128 {
    let every = every.as_millis().max(1);
    (since_epoch().as_millis() / every + 1) * every
}

/// Sleeps until `at_ms` since the epoch.
async fn sleep_until(at_ms: u128) {
    let now = since_epoch().as_millis();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis((at_ms - now) as u64)).await;
    }
}

/// One instance: runs until `args.triggers` triggers passed.
async fn instance(session: Session, args: Args) -> fencelock::Result<()> {
    let mut seen = 0;
    while args.triggers == 0 || seen < args.triggers {
        let trigger = next_trigger(args.every);
        sleep_until(trigger).await;
        seen += 1;
        let late = since_epoch().as_millis().saturating_sub(trigger);
        if late > args.window.as_millis() {
            println!("{}: trigger {trigger}: {late} ms late, skipped", args.name);
            continue;
        }
        let lock = format!("cron:{}:{trigger}", args.job);
        let Some(guard) = session.mutex(&lock)?.try_lock().await? else {
            println!("{}: trigger {trigger}: another instance runs it", args.name);
            continue;
        };
        // The job itself.
        println!(
            "{}: trigger {trigger}: running (token {})",
            args.name,
            guard.token()
        );
        if let Some(path) = &args.output {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    fencelock::Error::invalid_config(path.display().to_string(), e.to_string())
                })?;
            let _ = writeln!(f, "{trigger} {} {}", args.name, guard.token());
        }
        // Keep the trigger taken until no instance may still try it.
        sleep_until(trigger + 2 * args.window.as_millis()).await;
        guard.release().await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> fencelock::Result<()> {
    let args = Args::parse();
    if args.window * 2 >= args.every {
        return Err(fencelock::Error::invalid_config(
            format!("--window {:?}", args.window),
            "the window must be less than half the schedule (--every)",
        ));
    }
    let (backend, what) = args.backend.connect().await?;
    let start = |backend| {
        Session::builder(backend)
            .namespace(args.namespace.as_str())
            .ttl(args.ttl)
            .start()
    };
    if !args.backend.is_remote() {
        // A demo: three instances, four triggers.
        let mut tasks = Vec::new();
        for name in ["host-a", "host-b", "host-c"] {
            let args = Args {
                name: name.into(),
                triggers: 4,
                every: Duration::from_millis(500),
                window: Duration::from_millis(100),
                ..args.clone()
            };
            let s = start(backend.clone()).await?;
            tasks.push(tokio::spawn(instance(s, args)));
        }
        for t in tasks {
            t.await.expect("instance")?;
        }
        return Ok(());
    }
    println!(
        "{}: job {:?} every {:?} on {what}",
        args.name, args.job, args.every
    );
    let session = start(backend).await?;
    tokio::select! {
        r = instance(session.clone(), args) => r?,
        _ = shutdown_signal() => {}
    }
    session.close().await
}
