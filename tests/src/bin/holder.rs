//! A child process for fault tests: takes a lock or leads an election, prints
//! `HELD <token>`, then waits forever (to be SIGKILLed or SIGSTOPped by the test).
//!
//! `holder <etcd|zookeeper> <endpoint> <namespace> <lock|election> <name> <ttl-ms>`

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    fencelock_integration::faults::run_holder(&args).await;
}
