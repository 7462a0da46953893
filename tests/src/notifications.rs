//! The watch notifications a server sent, from its own counters: how a test or the benchmark
//! sees a thundering herd (every waiter woken by one release) from outside the client.
//!
//! - ZooKeeper: `mntr`'s `node_{created,deleted,changed,children}_watch_count` summaries
//!   (watchers triggered per event), summed;
//! - etcd: `etcd_debugging_mvcc_events_total` (events sent to watchers) from `/metrics`.

use crate::servers::fourlw;

/// The server-side count of watch notifications, read before and after a run.
#[derive(Debug, Clone)]
pub enum Notifications {
    /// A ZooKeeper server's four-letter-word port.
    ZooKeeper(u16),
    /// An etcd member's client address (`host:port`, plain HTTP).
    Etcd(String),
}

impl Notifications {
    /// The counter now.
    pub async fn read(&self) -> Option<f64> {
        match self {
            Notifications::ZooKeeper(port) => {
                let mntr = fourlw::ask_async(*port, "mntr").await?;
                let sum = ["created", "deleted", "changed", "children"]
                    .iter()
                    .map(|k| {
                        fourlw::mntr_value(&mntr, &format!("zk_sum_node_{k}_watch_count"))
                            .unwrap_or(0)
                    })
                    .sum::<u64>();
                Some(sum as f64)
            }
            Notifications::Etcd(addr) => {
                etcd_counter(addr, "etcd_debugging_mvcc_events_total", "").await
            }
        }
    }
}

/// The sum of an etcd member's counter `name` over the series whose labels contain `label`
/// (`""`: every series), from its `/metrics` (`addr`: `host:port`, plain HTTP).
pub async fn etcd_counter(addr: &str, name: &str, label: &str) -> Option<f64> {
    let addr = addr.to_string();
    let body = tokio::task::spawn_blocking(move || http_get(&addr, "/metrics"))
        .await
        .ok()??;
    let mut found = false;
    let sum = body
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']) && rest.contains(label))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .inspect(|_| found = true)
        .sum();
    found.then_some(sum)
}

/// A plain HTTP/1.0 GET (blocking, 5 s bounds): the body, if the answer is 200.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}
