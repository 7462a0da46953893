// TEMPORARY (to be deleted): runs bench_zk::zookeeper_rows.
#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("holder") {
        fencelock_integration::faults::run_holder(&argv[2..]).await;
        return;
    }
    let rounds = argv.get(1).and_then(|s| s.parse().ok()).unwrap_or(500);
    let seconds = argv.get(2).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    fencelock_integration::bench_zk::zookeeper_rows(rounds, seconds, &[1, 4, 16], 3).await;
}
