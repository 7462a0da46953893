//! A child process for fault tests: takes a lock or leads an election, prints
//! `HELD <token>`, then waits forever (to be SIGKILLed or SIGSTOPped by the test).
//!
//! `holder <etcd|zookeeper> <endpoint> <namespace> <lock|election> <name> <ttl-ms>`, or
//! `holder worker ...` for the workload's child workers (see `history::run_child_worker`).

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        fencelock_integration::history::run_child_worker(&args[1..]).await;
    } else {
        fencelock_integration::faults::run_holder(&args).await;
    }
}
