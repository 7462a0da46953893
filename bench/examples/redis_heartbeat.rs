//! What a Redis session's heartbeat costs the server while it holds many locks: one session
//! (TTL 6 s) takes N locks new to the server (64 in flight), holds them for three TTLs, then
//! releases them all; the server's slow log (every command of 1 ms or more) gives each
//! heartbeat script's time, during which the server serves no one else.
//!
//! `redis_heartbeat [N…]` (default 1000 10000 100000) starts its own `redis-server`
//! (loopback, no persistence) and prints, per N: acquisitions and releases per second, and
//! the heartbeats of 1 ms or more with their median and longest time.

use std::time::{Duration, Instant};

use fencelock::Session;
use fencelock_integration::servers::redis::{Durability, RedisServer};
use futures::StreamExt;

const TTL: Duration = Duration::from_secs(6);

#[tokio::main]
async fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number of locks"))
        .collect();
    let counts = if counts.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        counts
    };
    let server = tokio::task::spawn_blocking(|| RedisServer::start(Durability::None))
        .await
        .expect("the server");
    let cli = |args: &[&str]| server.cli(args).expect("redis-cli");
    cli(&["CONFIG", "SET", "slowlog-log-slower-than", "1000"]);
    cli(&["CONFIG", "SET", "slowlog-max-len", "10000"]);
    println!("| locks held | acquisitions/s | heartbeats of 1 ms or more | their median ms | longest ms | releases/s |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for n in counts {
        cli(&["FLUSHALL"]);
        cli(&["SLOWLOG", "RESET"]);
        let url = format!("redis://{}", server.addr());
        let backend = fencelock_redis::RedisBackend::connect(url.as_str())
            .await
            .expect("connect");
        let s = Session::builder(backend)
            .namespace("heartbeat")
            .ttl(TTL)
            .start()
            .await
            .expect("session");
        let start = Instant::now();
        let guards: Vec<_> = futures::stream::iter(0..n)
            .map(|i| {
                let m = s.mutex(&format!("l{i}")).expect("name");
                async move { m.lock().await.expect("lock") }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        let acquired = n as f64 / start.elapsed().as_secs_f64();
        tokio::time::sleep(TTL * 3).await;
        assert!(guards.iter().all(|g| g.is_held()), "a lock was lost");
        let start = Instant::now();
        futures::stream::iter(guards)
            .map(|g| async move { g.release().await.expect("release") })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await;
        let released = n as f64 / start.elapsed().as_secs_f64();
        s.close().await.expect("close");
        let mut beats = heartbeats(&cli(&["SLOWLOG", "GET", "10000"]));
        beats.sort_unstable();
        let ms = |us: u64| format!("{:.1}", us as f64 / 1000.0);
        let (median, longest) = match beats.len() {
            0 => ("-".to_string(), "-".to_string()),
            k => (ms(beats[k / 2]), ms(beats[k - 1])),
        };
        println!(
            "| {n} | {acquired:.0} | {} | {median} | {longest} | {released:.0} |",
            beats.len()
        );
    }
}

/// The durations (µs) of the heartbeat scripts in `redis-cli`'s `SLOWLOG GET` output: each
/// entry's lines are its id, time, duration, then the command's words.
fn heartbeats(log: &str) -> Vec<u64> {
    let lines: Vec<&str> = log.lines().map(str::trim).collect();
    lines
        .windows(5)
        .filter(|w| w[3] == "FCALL" && w[4].ends_with("_keep_alive"))
        .filter_map(|w| w[2].parse().ok())
        .collect()
}
