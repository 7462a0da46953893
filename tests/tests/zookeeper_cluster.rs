//! The adversity suite on a 3-server ZooKeeper ensemble: every scenario, its history checked,
//! a summary line printed per scenario (run with `--nocapture` to see the table).

use fencelock_integration::scenarios::{run, RunConfig, Scenario};
use fencelock_integration::zk_cluster::ZkEnsemble;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adversity_zookeeper_ensemble() {
    if !fencelock_integration::zookeeper::available() {
        return;
    }
    let mut ensemble = ZkEnsemble::start();
    let cfg = RunConfig::ci(env!("CARGO_BIN_EXE_holder"));
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    let only = std::env::var("FENCELOCK_SCENARIO").ok();
    for scenario in Scenario::ALL {
        if only.as_deref().is_some_and(|o| o != scenario.name()) {
            continue;
        }
        let s = run(scenario, &mut ensemble, &cfg).await;
        println!("{}", s.line());
        lines.push(s.line());
        if !s.violations.is_empty() {
            failed.push(format!("{}: {:?}", s.scenario, s.violations));
        }
    }
    println!(
        "\nZooKeeper (3 servers):\n{}",
        fencelock_integration::history::Summary::header()
    );
    for l in &lines {
        println!("{l}");
    }
    assert!(failed.is_empty(), "violations: {failed:#?}");
}
