//! Contended Redis acquisitions, one kind at a time, for profilers (`perf`, `pidstat`): the
//! benchmark program alternates ours and rslock's slices, which a profiler cannot tell apart.
//!
//! `contend <ours|rslock> <sessions> <seconds> <redis url>`: `sessions` contenders (one
//! connection each) lock and release one lock in a loop on a multi-threaded runtime, as the
//! benchmark's contended rows do; prints acquisitions per second and the fewest acquisitions of
//! one session as a share of the most.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::Session;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [what, n, seconds, url] = args.as_slice() else {
        eprintln!("usage: contend <ours|rslock> <sessions> <seconds> <redis url>");
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("a session count");
    let seconds: f64 = seconds.parse().expect("seconds");
    let stop = Arc::new(AtomicBool::new(false));
    let (mut tasks, mut counts) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let count = Arc::new(AtomicU64::new(0));
        let (stop, c) = (stop.clone(), count.clone());
        match what.as_str() {
            "ours" => {
                let b = fencelock_redis::RedisBackend::connect(url.as_str())
                    .await
                    .expect("connect");
                let s = Session::builder(b)
                    .namespace("contend")
                    .ttl(Duration::from_secs(10))
                    .start()
                    .await
                    .expect("session");
                let m = s.mutex("contended").expect("mutex");
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let g = m.lock().await.expect("lock");
                        g.release().await.expect("release");
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(s);
                }));
            }
            "rslock" => {
                let mut lm = rslock::LockManager::new(vec![url.clone()]);
                lm.set_retry(u32::MAX, Duration::from_millis(1));
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let l = lm
                            .acquire_no_guard(b"contend:rslock", Duration::from_secs(10))
                            .await
                            .expect("lock");
                        lm.unlock(&l).await;
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
            other => panic!("unknown kind {other}"),
        }
        counts.push(count);
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let per: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let total: u64 = per.iter().sum();
    let (least, most) = (
        per.iter().min().copied().unwrap_or(0),
        per.iter().max().copied().unwrap_or(0),
    );
    println!(
        "{what} {n} sessions: {:.0} acquisitions/s, fairness {:.2}",
        total as f64 / secs,
        least as f64 / most.max(1) as f64
    );
}
