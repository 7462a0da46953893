//! The floor of a fair handoff over Redis pub/sub with the `redis` crate: `n` clients pass one
//! token round a ring, each publishing to the next one's channel as soon as its own message
//! arrives. No lock, no script: what one notification hop costs, to compare with the contended
//! rows (a fair lock hands over by such a hop; an unfair one, like rslock's retry loop, mostly
//! lets the releaser take it again).
//!
//! `handoff_floor <pubsub|push> <clients> <seconds> <redis url>`: `pubsub` receives on a
//! `PubSub` connection read by a task of its own (the crate's driver task, then the reader,
//! then the waiting task: fencelock's path today); `push` receives on a RESP3 connection whose
//! push sender wakes the waiting task directly (one task fewer). Prints handoffs per second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::AsyncCommands;
use tokio::sync::Notify;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, n, seconds, url] = args.as_slice() else {
        eprintln!("usage: handoff_floor <pubsub|push> <clients> <seconds> <redis url>");
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("a client count");
    let seconds: f64 = seconds.parse().expect("seconds");
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let mut keep = Vec::new();
    for i in 0..n {
        let channel = format!("floor:{i}");
        let next = format!("floor:{}", (i + 1) % n);
        let woken = Arc::new(Notify::new());
        match mode.as_str() {
            "pubsub" => {
                let client = redis::Client::open(url.as_str()).expect("url");
                let mut ps = client.get_async_pubsub().await.expect("pubsub");
                ps.subscribe(&channel).await.expect("subscribe");
                let (sink, mut stream) = ps.split();
                keep.push(Box::new(sink) as Box<dyn Send>);
                let w = woken.clone();
                tasks.push(tokio::spawn(async move {
                    while stream.next().await.is_some() {
                        w.notify_one();
                    }
                }));
            }
            "push" => {
                let resp3 = format!("{url}?protocol=resp3");
                let client = redis::Client::open(resp3.as_str()).expect("url");
                let w = woken.clone();
                let config = redis::AsyncConnectionConfig::new().set_push_sender(
                    move |info: redis::PushInfo| {
                        if info.kind == redis::PushKind::Message {
                            w.notify_one();
                        }
                        Ok::<(), redis::aio::SendError>(())
                    },
                );
                let mut con = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .expect("connect");
                con.subscribe(&channel).await.expect("subscribe");
                keep.push(Box::new(con) as Box<dyn Send>);
            }
            _ => {
                eprintln!("mode: pubsub or push");
                std::process::exit(2);
            }
        }
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut out = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let (stop, count) = (stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                woken.notified().await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                count.fetch_add(1, Ordering::Relaxed);
                let _: i64 = out.publish(&next, "go").await.expect("publish");
            }
        }));
    }
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: i64 = con.publish("floor:0", "go").await.expect("publish");
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let done = count.load(Ordering::Relaxed);
    println!(
        "{mode} {n} clients: {:.0} handoffs/s",
        done as f64 / start.elapsed().as_secs_f64()
    );
    std::process::exit(0);
}
