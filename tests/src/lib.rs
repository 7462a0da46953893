//! Test harnesses for fencelock: real etcd and ZooKeeper servers started from the binaries of
//! Debian's packages on loopback ports with temporary data dirs, and the conformance
//! factories over them. Also home of the benchmark program (`src/bin/bench.rs`).

pub mod bench_util;
pub mod bench_zk;
pub mod cluster;
pub mod curator;
pub mod etcd;
pub mod faults;
pub mod history;
pub mod proxy;
pub mod scenarios;
pub mod zk_cluster;
pub mod zookeeper;

/// Whether we run in CI (`CI=true`), where a missing server is a failure, never a skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A free TCP port on 127.0.0.1 (bound once and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
