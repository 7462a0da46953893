//! Whether a server that takes connections but opens no session is a ZooKeeper server at all
//! (a port of Redis or of an HTTP server listed by mistake): told apart by a four-letter word,
//! which every ZooKeeper server answers, with its status or with its refusal to run it.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::Resolved;

/// What a ZooKeeper server's answer to `srvr` holds, whether it runs it ("Zookeeper version:
/// …", "This ZooKeeper instance is not currently serving requests") or not ("srvr is not
/// executed because it is not in the whitelist.").
const ZOOKEEPER_MARKS: [&str; 4] = ["zookeeper", "whitelist", "allowlist", "not executed"];

/// Asks `host:port` (plaintext) for `srvr`, within `within`: the first line of its answer if
/// it answered as something else than a ZooKeeper server; `None` if it answered as one, or not
/// at all (hung, or a ZooKeeper server that is stopped: nothing told).
async fn foreign_answer(host: &str, port: u16, within: Duration) -> Option<String> {
    let asked = async {
        let mut conn = TcpStream::connect((host, port)).await.ok()?;
        // The newline ends the word for a server that reads lines (Redis, HTTP); ZooKeeper
        // reads four bytes (a Netty port that takes both TLS and plaintext decides on five).
        conn.write_all(b"srvr\n").await.ok()?;
        // The first part of the answer is enough (Redis keeps the connection open after it).
        let mut answer = vec![0; 512];
        let n = conn.read(&mut answer).await.ok()?;
        answer.truncate(n);
        Some(answer)
    };
    let answer = tokio::time::timeout(within, asked).await.ok()??;
    if answer.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(&answer);
    let lower = text.to_lowercase();
    if ZOOKEEPER_MARKS.iter().any(|m| lower.contains(m)) {
        return None;
    }
    let line = text.lines().next().unwrap_or_default().trim();
    Some(
        line.chars()
            .take(60)
            .map(|c| if c.is_control() { '?' } else { c })
            .collect(),
    )
}

impl Resolved {
    /// Resolves, if server `server` (an index in [`Resolved::each`]) answers as another service
    /// (Redis, an HTTP server), to what it said; never otherwise. Asked only `after`
    /// (`HEDGE_AFTER`: a ZooKeeper server has given its session by then), plaintext only:
    /// such a server took the connection and gave no session, and the connect said only "no
    /// session within the connect timeout", a temporary error (black-box round 39).
    pub(super) async fn another_service(
        &self,
        server: usize,
        deadline: Instant,
        after: Duration,
    ) -> String {
        tokio::time::sleep(after).await;
        let (host, port) = &self.hosts[server];
        let within = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(100), Duration::from_secs(2));
        let answer = match &self.tls {
            None => foreign_answer(host, *port, within).await,
            Some(_) => None,
        };
        match answer {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }
}
