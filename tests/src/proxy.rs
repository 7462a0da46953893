//! A TCP proxy the tests control, placed between a client and a server on loopback: it can
//! pass traffic, delay it, black-hole it (connections stay open, nothing flows), lose the
//! replies, hold a gRPC client's requests and deliver them late, or reset every connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Pass,
    /// Forward everything after this delay per chunk, one chunk after the other (a link of
    /// next to no bandwidth: traffic queues behind each chunk's delay).
    Delay(Duration),
    /// Forward everything this long after it was read, reading on meanwhile: a link of this
    /// one-way latency and full bandwidth (a slow link, not a narrow one).
    Latency(Duration),
    /// Keep connections open but forward nothing (a partition without resets).
    BlackHole,
    /// Forward the client's traffic but nothing back (a one-way partition: requests arrive,
    /// replies wait).
    BlackHoleReplies,
    /// Forward the client's traffic, and read the server's and throw it away (a middlebox
    /// that loses one direction of a stream: what is lost never comes, even once the mode
    /// changes back).
    DropReplies,
    /// Close every connection and refuse new ones.
    Reset,
    /// Nothing flows, but the client's bytes are read and kept; at the next mode they are
    /// delivered first, less the client's HTTP/2 stream cancellations, pings and goaways: a
    /// member that resumes from a pause and then serves the requests its clients gave up on
    /// (cancellations the client sent later are lost in the pause). For plaintext gRPC (etcd)
    /// only.
    Hold,
}

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    mode: Arc<watch::Sender<Mode>>,
    task: tokio::task::JoinHandle<()>,
    /// Where new connections go.
    upstream: Arc<Mutex<String>>,
    /// The connections made so far (ended by [`Proxy::retarget`]).
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let (tx, _) = watch::channel(Mode::Pass);
        let mode = Arc::new(tx);
        let upstream = Arc::new(Mutex::new(upstream.to_string()));
        let conns = Arc::new(Mutex::new(Vec::<tokio::task::AbortHandle>::new()));
        let m = mode.clone();
        let (target, made) = (upstream.clone(), conns.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if *m.borrow() == Mode::Reset {
                    drop(client);
                    continue;
                }
                let upstream = target.lock().unwrap().clone();
                let rx = m.subscribe();
                let conn = tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        // Set once the client's bytes were kept (`Mode::Hold`).
                        let kept = Arc::new(AtomicBool::new(false));
                        tokio::select! {
                            _ = pipe(cr, sw, rx.clone(), false, kept.clone()) => {}
                            _ = pipe(sr, cw, rx, true, kept) => {}
                        }
                    }
                });
                let mut made = made.lock().unwrap();
                made.retain(|c| !c.is_finished());
                made.push(conn.abort_handle());
            }
        });
        Proxy {
            port,
            mode,
            task,
            upstream,
            conns,
        }
    }

    /// Sends new connections to `upstream` and closes the current ones, as a virtual IP that
    /// moves to a promoted replica does.
    pub fn retarget(&self, upstream: &str) {
        *self.upstream.lock().unwrap() = upstream.to_string();
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address clients connect to, `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Changes what the proxy does, for current and future connections.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.mode.send_replace(Mode::Reset);
    }
}

/// Forwards `from` to `to` as the mode says; `replies`: the server-to-client direction;
/// `kept`: set once the client's bytes were held back (`Mode::Hold`), for both directions.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    replies: bool,
    kept_once: Arc<AtomicBool>,
) {
    // Replies are not read while requests are held (as in a black hole); requests are.
    let held = |m: Mode| {
        m == Mode::BlackHole || (replies && (m == Mode::BlackHoleReplies || m == Mode::Hold))
    };
    let mut buf = vec![0u8; 64 * 1024];
    // The client's frames, followed from the start of the connection (what goes to the server
    // is always the parser's output, so that a change of mode mid-frame keeps the framing),
    // and those kept by `Mode::Hold`.
    let mut frames = H2Frames::default();
    let mut kept: Vec<u8> = Vec::new();
    let mut client_gone = false;
    loop {
        // Wait while black-holed; stop on reset.
        let current = loop {
            let m = *mode.borrow_and_update();
            match m {
                m if held(m) => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                Mode::Reset => return,
                Mode::Hold if client_gone => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                other => break other,
            }
        };
        if current != Mode::Hold
            && !kept.is_empty()
            && to.write_all(&std::mem::take(&mut kept)).await.is_err()
        {
            return;
        }
        if client_gone {
            // What was kept is delivered: the server gets time to serve it before it sees the
            // connection end (which would cancel it).
            tokio::time::sleep(Duration::from_secs(3)).await;
            return;
        }
        if let Mode::Latency(d) = current {
            let pass = |data: &[u8]| frames.forward(data, replies, false);
            if !with_latency(&mut from, &mut to, &mut mode, d, &mut buf, pass).await {
                return;
            }
            continue;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) if current == Mode::Hold => {
                    client_gone = true;
                    continue;
                }
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = mode.changed() => continue,
        };
        let data = frames.forward(&buf[..n], replies, current == Mode::Hold);
        if let Mode::Delay(d) = current {
            tokio::time::sleep(d).await;
        }
        match *mode.borrow() {
            Mode::Reset => return,
            // The client's bytes, kept to be served late.
            Mode::Hold if !replies => {
                kept_once.store(true, Ordering::SeqCst);
                kept.extend_from_slice(&data);
                continue;
            }
            // Replies read before a pause began are delivered.
            Mode::Hold => {}
            Mode::DropReplies if replies => continue,
            // Data read just before a black-hole is dropped, like a lost packet.
            m if held(m) => continue,
            _ => {}
        }
        if to.write_all(&data).await.is_err() {
            if replies && kept_once.load(Ordering::SeqCst) {
                // The client left while its kept requests are served: the connection ends with
                // the server's side (bounded), not at once, which would cancel them.
                let drain = async { while matches!(from.read(&mut buf).await, Ok(n) if n > 0) {} };
                let _ = tokio::time::timeout(Duration::from_secs(10), drain).await;
            }
            return;
        }
    }
}

/// Forwards `from` to `to` with the one-way latency `d` ([`Mode::Latency`]) until the mode
/// changes (returns true, what was read delivered) or either side ends (false, once what was
/// read is delivered). `pass` makes what is read into what is sent.
async fn with_latency(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    mode: &mut watch::Receiver<Mode>,
    d: Duration,
    buf: &mut [u8],
    mut pass: impl FnMut(&[u8]) -> Vec<u8>,
) -> bool {
    use tokio::time::{sleep_until, Instant};
    let mut due: std::collections::VecDeque<(Instant, Vec<u8>)> = Default::default();
    let ended = loop {
        let next = due.front().map(|(at, _)| *at);
        tokio::select! {
            r = from.read(buf) => match r {
                Ok(0) | Err(_) => break true,
                Ok(n) => due.push_back((Instant::now() + d, pass(&buf[..n]))),
            },
            () = sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                let (_, data) = due.pop_front().expect("a chunk is due");
                if to.write_all(&data).await.is_err() {
                    return false;
                }
            }
            _ = mode.changed() => break false,
        }
    };
    for (at, data) in due {
        if ended {
            sleep_until(at).await;
        }
        if to.write_all(&data).await.is_err() {
            return false;
        }
    }
    !ended
}

/// A client's HTTP/2 byte stream, split into its frames as it passes (after the 24-byte
/// connection preface), so that some can be left out. Bytes pass on at once unless they are
/// filtered: a frame header is kept back only while filtering, until its type is known (other
/// protocols, which the same proxy carries, never see their bytes held back).
#[derive(Debug)]
struct H2Frames {
    preface_left: usize,
    header: Vec<u8>,
    /// The bytes of the current header already passed on (it began while not filtering).
    header_passed: bool,
    body_left: usize,
    dropping: bool,
}

impl Default for H2Frames {
    fn default() -> Self {
        H2Frames {
            preface_left: 24,
            header: Vec::with_capacity(9),
            header_passed: false,
            body_left: 0,
            dropping: false,
        }
    }
}

impl H2Frames {
    /// What of `data`, read from one side, goes to the other: replies as they are, the
    /// client's bytes through [`pass`](Self::pass) (`filter` while held).
    fn forward(&mut self, data: &[u8], replies: bool, filter: bool) -> Vec<u8> {
        if replies {
            return data.to_vec();
        }
        let mut out = Vec::with_capacity(data.len());
        self.pass(data, filter, &mut out);
        out
    }

    /// Appends `data` to `out`, less (if `filter`) the frames that would cancel or end what
    /// came before them: RST_STREAM, PING (a burst of them is taken for abuse) and GOAWAY.
    fn pass(&mut self, mut data: &[u8], filter: bool, out: &mut Vec<u8>) {
        while !data.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(data.len());
                out.extend_from_slice(&data[..n]);
                self.preface_left -= n;
                data = &data[n..];
            } else if self.body_left > 0 {
                let n = self.body_left.min(data.len());
                if !self.dropping {
                    out.extend_from_slice(&data[..n]);
                }
                self.body_left -= n;
                data = &data[n..];
            } else {
                if self.header.is_empty() {
                    self.header_passed = !filter;
                }
                let n = (9 - self.header.len()).min(data.len());
                if self.header_passed {
                    out.extend_from_slice(&data[..n]);
                }
                self.header.extend_from_slice(&data[..n]);
                data = &data[n..];
                if self.header.len() == 9 {
                    let h = &self.header;
                    self.body_left = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                    // A header already passed on keeps its frame whole.
                    self.dropping = !self.header_passed && matches!(h[3], 0x3 | 0x6 | 0x7);
                    if !self.dropping && !self.header_passed {
                        out.extend_from_slice(h);
                    }
                    self.header.clear();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::H2Frames;

    #[test]
    fn held_frames_lose_their_cancellations() {
        let mut stream = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let frame = |kind: u8, body: &[u8]| {
            let mut f = vec![0, 0, body.len() as u8, kind, 0, 0, 0, 0, 1];
            f.extend_from_slice(body);
            f
        };
        let (headers, data, rst) = (
            frame(0x1, b"hdr"),
            frame(0x0, b"body"),
            frame(0x3, b"\0\0\0\x08"),
        );
        for f in [&headers, &data, &rst] {
            stream.extend_from_slice(f);
        }
        // Passed whole, byte by byte: unchanged.
        let mut f = H2Frames::default();
        let mut out = Vec::new();
        for b in &stream {
            f.pass(std::slice::from_ref(b), false, &mut out);
        }
        assert_eq!(out, stream);
        // Not filtering, every byte passes on at once (a Redis or ZooKeeper request is never
        // held back waiting for a "frame header" to complete).
        let mut f = H2Frames::default();
        let mut out = Vec::new();
        for (i, b) in stream.iter().enumerate() {
            f.pass(std::slice::from_ref(b), false, &mut out);
            assert_eq!(out.len(), i + 1);
        }
        // Filtered in two pieces: the RST_STREAM is gone.
        let mut f = H2Frames::default();
        let mut out = Vec::new();
        f.pass(&stream[..30], true, &mut out);
        f.pass(&stream[30..], true, &mut out);
        assert_eq!(out, [&stream[..24], &headers[..], &data[..]].concat());
    }
}
