//! One pub/sub connection per session, shared by everything the session waits for.
//!
//! A wait registers for a channel *before* it reads (subscribing is confirmed by the server),
//! so a change published between the two cannot be missed. Redis pub/sub keeps no backlog: if
//! the connection breaks, every registration is marked broken and its wait fails with a
//! temporary error, which the core retries (registering again on a new connection).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use fencelock::Result;
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::{Mutex as AsyncMutex, Notify};

use crate::error::{map, temporary};

/// How often an idle pub/sub connection is checked with a `PING`.
const PING_EVERY: Duration = Duration::from_secs(5);

/// The session's pub/sub hub.
pub(crate) struct Notifier {
    client: redis::Client,
    timeout: Duration,
    conn: AsyncMutex<Option<Conn>>,
    regs: Arc<StdMutex<Regs>>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Regs {
    by_channel: HashMap<String, Vec<(u64, Arc<Signal>)>>,
    /// Channels whose last registration went: unsubscribed at the next registration.
    stale: Vec<String>,
}

struct Conn {
    sink: PubSubSink,
    subscribed: HashSet<String>,
    alive: Arc<AtomicBool>,
    /// The task that reads the messages: the connection lives as long as it runs.
    reader: tokio::task::AbortHandle,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Marks every registration broken: the messages of its connection are lost, so each wait must
/// read again.
fn break_all(regs: &StdMutex<Regs>) {
    let regs = regs.lock().unwrap_or_else(|e| e.into_inner());
    for (_, signal) in regs.by_channel.values().flatten() {
        signal.broken.store(true, Ordering::SeqCst);
        signal.notify.notify_one();
    }
}

#[derive(Default)]
struct Signal {
    notify: Notify,
    broken: AtomicBool,
    /// Whether a `gone` message (the entry was deleted) arrived since the last wait.
    gone: AtomicBool,
}

/// A registration for one channel; unregisters when dropped.
pub(crate) struct Registration {
    channel: String,
    id: u64,
    signal: Arc<Signal>,
    regs: Arc<StdMutex<Regs>>,
}

impl Registration {
    /// Waits for the next message on the channel since the registration (or since the last
    /// call); returns whether one of them said the entry was deleted (`gone`). Fails with a
    /// temporary error if the connection broke meanwhile.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message that arrives meanwhile is kept for the next call.
    pub(crate) async fn notified(&self) -> Result<bool> {
        if !self.signal.broken.load(Ordering::SeqCst) {
            self.signal.notify.notified().await;
        }
        if self.signal.broken.load(Ordering::SeqCst) {
            return Err(temporary("wait", "the pub/sub connection broke"));
        }
        Ok(self.signal.gone.swap(false, Ordering::SeqCst))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = regs.by_channel.get_mut(&self.channel) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                regs.by_channel.remove(&self.channel);
                regs.stale.push(std::mem::take(&mut self.channel));
            }
        }
    }
}

impl Notifier {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Self {
        Notifier {
            client,
            timeout,
            conn: AsyncMutex::new(None),
            regs: Arc::default(),
            next_id: AtomicU64::new(0),
        }
    }

    /// Registers for `channel`, subscribing first if needed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a cancelled registration leaves at most a subscription nobody listens to,
    /// dropped at a later registration.
    pub(crate) async fn register(&self, channel: String) -> Result<Registration> {
        let mut slot = self.conn.lock().await;
        if slot
            .as_ref()
            .is_some_and(|c| !c.alive.load(Ordering::SeqCst))
        {
            *slot = None;
            break_all(&self.regs);
        }
        if slot.is_none() {
            *slot = Some(self.connect().await?);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(temporary("subscribe", "no pub/sub connection"));
        };
        // One stale channel at a time, each taken off the list only once handled: a cancelled
        // registration leaves the rest for the next one.
        loop {
            let next = {
                let mut guard = self.regs.lock().unwrap_or_else(|e| e.into_inner());
                let Regs { by_channel, stale } = &mut *guard;
                stale.retain(|c| !by_channel.contains_key(c));
                stale.last().cloned()
            };
            let Some(channel) = next else { break };
            if conn.subscribed.contains(&channel) {
                let _ = tokio::time::timeout(self.timeout, conn.sink.unsubscribe(&channel)).await;
                conn.subscribed.remove(&channel);
            }
            let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
            regs.stale.retain(|c| c != &channel);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let signal = Arc::new(Signal::default());
        self.regs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_channel
            .entry(channel.clone())
            .or_default()
            .push((id, signal.clone()));
        let reg = Registration {
            channel: channel.clone(),
            id,
            signal,
            regs: self.regs.clone(),
        };
        // The reader may have found the connection dead before the registration was in the
        // list (it would then never be marked broken).
        if !conn.alive.load(Ordering::SeqCst) {
            return Err(temporary("subscribe", "the pub/sub connection broke"));
        }
        if !conn.subscribed.contains(&channel) {
            match tokio::time::timeout(self.timeout, conn.sink.subscribe(&channel)).await {
                Ok(Ok(())) => {
                    conn.subscribed.insert(channel);
                }
                Ok(Err(e)) => {
                    conn.alive.store(false, Ordering::SeqCst);
                    return Err(map("subscribe", e));
                }
                Err(_) => {
                    conn.alive.store(false, Ordering::SeqCst);
                    return Err(temporary("subscribe", "timed out"));
                }
            }
        }
        Ok(reg)
    }

    async fn connect(&self) -> Result<Conn> {
        let pubsub = match tokio::time::timeout(self.timeout, self.client.get_async_pubsub()).await
        {
            Ok(r) => r.map_err(|e| map("subscribe", e))?,
            Err(_) => return Err(temporary("subscribe", "connect timed out")),
        };
        let (sink, mut stream) = pubsub.split();
        let alive = Arc::new(AtomicBool::new(true));
        let (regs, flag) = (self.regs.clone(), alive.clone());
        let (mut pinger, timeout) = (sink.clone(), self.timeout);
        let reader = tokio::spawn(async move {
            // A connection that died without a reset (a crashed host, a dropped NAT entry)
            // delivers nothing and reports nothing: a ping every PING_EVERY finds it.
            let mut tick = tokio::time::interval(PING_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let msg = tokio::select! {
                    msg = stream.next() => msg,
                    _ = tick.tick() => {
                        let pong = tokio::time::timeout(timeout, pinger.ping::<redis::Value>()).await;
                        if matches!(pong, Ok(Ok(_))) {
                            continue;
                        }
                        None
                    }
                };
                let Some(msg) = msg else { break };
                let regs = regs.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(list) = regs.by_channel.get(msg.get_channel_name()) {
                    let gone = msg.get_payload_bytes() == b"gone";
                    for (_, signal) in list {
                        if gone {
                            signal.gone.store(true, Ordering::SeqCst);
                        }
                        signal.notify.notify_one();
                    }
                }
            }
            // The connection is gone, and with it any message sent meanwhile. Marked dead
            // first, so that a registration added from now on fails instead of waiting here.
            flag.store(false, Ordering::SeqCst);
            break_all(&regs);
        });
        Ok(Conn {
            sink,
            subscribed: HashSet::new(),
            alive,
            reader: reader.abort_handle(),
        })
    }

    /// Drops the pub/sub connection (the session is closing).
    pub(crate) async fn shutdown(&self) {
        *self.conn.lock().await = None;
        break_all(&self.regs);
    }
}
