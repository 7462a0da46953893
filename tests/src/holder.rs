//! The child processes of the fault tests, the adversity suite and the benchmark (the `holder`
//! binary, and the benchmark's `holder` mode): one holds a lock or leads an election until it is
//! killed, the other loops as a worker of the adversity workload, so that a test can SIGKILL or
//! SIGSTOP a real process.

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::adversity::primitive::Primitive;
use crate::adversity::workload::{run_child_worker, Workload};
use crate::faults::run_holder;
use crate::target::{Kind, Target};

/// The command line of a child process.
#[derive(Parser, Debug)]
#[command(about = "A fencelock holder or worker process, for fault tests")]
pub struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Takes the lock or leads the election, prints `HELD <token>`, then waits forever.
    Hold {
        /// `etcd` or `zookeeper`.
        #[arg(value_parser = parse_kind)]
        kind: Kind,
        /// The cluster's endpoints, comma-separated.
        endpoints: String,
        /// The session's namespace.
        namespace: String,
        /// `lock` or `election`.
        what: String,
        /// The lock's or election's name.
        name: String,
        /// The session TTL in milliseconds.
        ttl_ms: u64,
    },
    /// Loops acquire → `G token` → hold → `W token` → release → `E token` until killed.
    Work {
        /// `etcd` or `zookeeper`.
        #[arg(value_parser = parse_kind)]
        kind: Kind,
        /// The cluster's endpoints, comma-separated.
        endpoints: String,
        /// The session's namespace.
        namespace: String,
        /// The lock's name.
        lock: String,
        /// The session TTL in milliseconds.
        ttl_ms: u64,
        /// How long each tenure lasts, in milliseconds.
        hold_ms: u64,
        /// The bound of each acquisition, in milliseconds.
        timeout_ms: u64,
        /// What the lock is: `mutex`, `read-write` (the child writes), `semaphore:N`.
        #[arg(long, default_value = "mutex", value_parser = parse_primitive)]
        primitive: Primitive,
    },
}

fn parse_primitive(s: &str) -> Result<Primitive, String> {
    Primitive::parse(s).ok_or_else(|| format!("unknown primitive {s:?}"))
}

fn parse_kind(s: &str) -> Result<Kind, String> {
    Kind::parse(s).ok_or_else(|| format!("unknown backend {s:?} (etcd or zookeeper)"))
}

/// Runs the child process that `args` (the whole command line, program name first) asks for.
pub async fn run(args: impl IntoIterator<Item = String>) {
    match Args::parse_from(args).command {
        Cmd::Hold {
            kind,
            endpoints,
            namespace,
            what,
            name,
            ttl_ms,
        } => {
            let t = Target::new(kind, endpoints);
            run_holder(&t, &namespace, &what, &name, Duration::from_millis(ttl_ms)).await
        }
        Cmd::Work {
            kind,
            endpoints,
            namespace,
            lock,
            ttl_ms,
            hold_ms,
            timeout_ms,
            primitive,
        } => {
            let w = Workload {
                lock,
                primitive,
                namespace,
                ttl: Duration::from_millis(ttl_ms),
                acquire_timeout: Duration::from_millis(timeout_ms),
                hold: Duration::from_millis(hold_ms),
            };
            run_child_worker(kind, &endpoints, &w).await
        }
    }
}
