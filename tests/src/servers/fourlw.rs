//! The ZooKeeper four-letter-word client (`ruok`, `srvr`, `cons`, `mntr`, ...).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Sends `cmd` to the server on `port` and returns its answer, or `None` if it does not answer
/// (1 s to connect, 2 s to read). Blocking.
pub fn ask(port: u16, cmd: &str) -> Option<String> {
    let addr = ([127, 0, 0, 1], port).into();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(cmd.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// [`ask`] from async code (on a blocking thread).
pub async fn ask_async(port: u16, cmd: &str) -> Option<String> {
    let cmd = cmd.to_string();
    tokio::task::spawn_blocking(move || ask(port, &cmd))
        .await
        .ok()
        .flatten()
}

/// The value of `key` in a `mntr` answer (`zk_watch_count`, `zk_packets_received`, ...).
pub fn mntr_value(mntr: &str, key: &str) -> Option<u64> {
    mntr.lines().find_map(|l| {
        let (k, v) = l.split_once('\t')?;
        (k.trim() == key).then(|| v.trim().parse().ok()).flatten()
    })
}
