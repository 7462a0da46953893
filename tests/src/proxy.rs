//! A TCP proxy the tests control, placed between a client and a server on loopback: it can
//! pass traffic, delay it, black-hole it (connections stay open, nothing flows) or reset every
//! connection.

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
    /// Forward everything after this delay per chunk.
    Delay(Duration),
    /// Keep connections open but forward nothing (a partition without resets).
    BlackHole,
    /// Forward the client's traffic but nothing back (a one-way partition: requests arrive,
    /// replies wait).
    BlackHoleReplies,
    /// Close every connection and refuse new ones.
    Reset,
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
                        tokio::select! {
                            _ = pipe(cr, sw, rx.clone(), false) => {}
                            _ = pipe(sr, cw, rx, true) => {}
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

/// Forwards `from` to `to` as the mode says; `replies`: the server-to-client direction.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    replies: bool,
) {
    let held = |m: Mode| m == Mode::BlackHole || (replies && m == Mode::BlackHoleReplies);
    let mut buf = vec![0u8; 64 * 1024];
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
                other => break other,
            }
        };
        let n = tokio::select! {
            r = from.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
            _ = mode.changed() => continue,
        };
        if let Mode::Delay(d) = current {
            tokio::time::sleep(d).await;
        }
        // Data read just before a black-hole or reset is dropped, like a lost packet.
        match *mode.borrow() {
            m if held(m) => continue,
            Mode::Reset => return,
            _ => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
