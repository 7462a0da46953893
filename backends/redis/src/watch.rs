//! One pub/sub connection per session, shared by everything the session waits for.
//!
//! A wait registers for a channel *before* it reads (subscribing is confirmed by the server),
//! so a change published between the two cannot be missed. Redis pub/sub keeps no backlog: if
//! the connection breaks, every registration is marked broken and its wait fails with a
//! temporary error, which the core retries (registering again on a new connection).
//!
//! A channel is unsubscribed as soon as its last registration goes (by a task of the
//! connection, so that a `Drop` needs no runtime): entry names repeat (`{queue}/{session}`), and
//! a subscription left behind would make the next entry of that name wake a waiter that no
//! longer waits — a herd of stale subscribers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use fencelock::Result;
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::{mpsc, Mutex as AsyncMutex, Notify};

use crate::error::{map, temporary};
use crate::layout::OWN_PREFIX;
use crate::own_channel::inbox::{self, Inbox, Word};
use crate::primary::Primary;

/// How often an idle pub/sub connection is checked with a `PING` (more often for short TTLs:
/// at most every half TTL).
const PING_EVERY: Duration = Duration::from_secs(5);

/// The session's pub/sub hub.
pub(crate) struct Notifier {
    primary: Arc<Primary>,
    timeout: Duration,
    /// How often the connection is pinged, and how long a `PING` may take before the
    /// connection counts as dead (its server hung: every message sent meanwhile is lost).
    ping_every: Duration,
    pong_within: Duration,
    conn: AsyncMutex<Option<Conn>>,
    regs: Arc<StdMutex<Regs>>,
    next_id: AtomicU64,
    /// Where a registration that goes sends its channel: the current connection's task (a
    /// channel unsubscribed on the connection it is subscribed on now, whichever one the
    /// registration was made on).
    unsubscribe: Unsubscribe,
}

type Unsubscribe = Arc<StdMutex<Option<mpsc::UnboundedSender<String>>>>;

#[derive(Default)]
struct Regs {
    by_channel: HashMap<String, Vec<(u64, Arc<Signal>)>>,
}

/// The channels a connection has sent a `SUBSCRIBE` for, each with whether the server
/// confirmed it. Held across each subscribe and unsubscribe, so that the two never interleave
/// on one channel.
type Subscribed = Arc<AsyncMutex<HashMap<String, bool>>>;

struct Conn {
    /// The generation of the primary it is connected to: replaced once the primary moved.
    generation: u64,
    /// The client it was made with (on a cluster, one node's: the next one is tried after it
    /// fails).
    client: redis::Client,
    sink: PubSubSink,
    subscribed: Subscribed,
    alive: Arc<AtomicBool>,
    /// The tasks that read the messages and unsubscribe: the connection lives as long as they
    /// run.
    tasks: [tokio::task::AbortHandle; 2],
}

impl Drop for Conn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Marks every registration broken: the messages of its connection are lost, so each wait must
/// read again.
fn break_all(regs: &StdMutex<Regs>) {
    let regs = regs.lock().unwrap_or_else(|e| e.into_inner());
    for (_, signal) in regs.by_channel.values().flatten() {
        signal.broken.store(true, Ordering::SeqCst);
        signal.notify.notify_one();
        // A session's own channel: every wait that listens there.
        signal
            .inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wake_all();
    }
}

#[derive(Default)]
struct Signal {
    notify: Notify,
    broken: AtomicBool,
    /// Whether a `gone` message (the entry was deleted) arrived since the last wait.
    gone: AtomicBool,
    /// The live entry that the deletion left at the head of the queue, its token, and whether
    /// the deleted entry had expired, if its message named one (`gone NAME TOKEN`, `gone NAME
    /// TOKEN expired`: see [`crate::expired`]).
    head: StdMutex<Option<(String, u64, bool)>>,
    /// On a session's own channel: what arrived for its entries, and who listens.
    inbox: StdMutex<Inbox>,
}

/// A registration for one channel; unregisters when dropped.
pub(crate) struct Registration {
    channel: String,
    id: u64,
    signal: Arc<Signal>,
    regs: Arc<StdMutex<Regs>>,
    unsubscribe: Unsubscribe,
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

    /// The entry (name, token) that the deletion [`notified`](Self::notified) reported left,
    /// live, at the head of its queue, if the message named one, and whether the deleted entry
    /// had expired. (A message may be late, or come twice: only an entry with that very token
    /// may rely on it.)
    pub(crate) fn head(&self) -> Option<(String, u64, bool)> {
        self.signal
            .head
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// On a session's own channel: waits for a message to entry `name` with token `token`
    /// (see [`inbox::news`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message stays in the inbox until a call takes it.
    pub(crate) async fn news(
        &self,
        name: &str,
        token: u64,
        until: tokio::time::Instant,
    ) -> Result<Option<Word>> {
        inbox::news(&self.signal.inbox, &self.signal.broken, name, token, until).await
    }

    /// On a session's own channel: forgets the messages to entry `name` up to token `upto`.
    pub(crate) fn forget(&self, name: &str, upto: Option<u64>) {
        self.signal
            .inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(name, upto);
    }

    /// Whether its connection broke (every message since is lost).
    pub(crate) fn is_broken(&self) -> bool {
        self.signal.broken.load(Ordering::SeqCst)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let last = {
            let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
            match regs.by_channel.get_mut(&self.channel) {
                Some(list) => {
                    list.retain(|(id, _)| *id != self.id);
                    let last = list.is_empty();
                    if last {
                        regs.by_channel.remove(&self.channel);
                    }
                    last
                }
                None => false,
            }
        };
        if last {
            // The connection's task unsubscribes, unless someone registered again meanwhile
            // (a closed connection needs nothing: its subscriptions went with it).
            let current = self.unsubscribe.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(tx) = current.as_ref() {
                let _ = tx.send(std::mem::take(&mut self.channel));
            }
        }
    }
}

impl Notifier {
    /// The hub of a session of TTL `ttl`, waiting `timeout` for the server at most.
    pub(crate) fn new(primary: Arc<Primary>, timeout: Duration, ttl: Duration) -> Self {
        Notifier {
            primary,
            timeout,
            ping_every: PING_EVERY.min(ttl / 2),
            pong_within: timeout.min(ttl / 3),
            conn: AsyncMutex::new(None),
            regs: Arc::default(),
            next_id: AtomicU64::new(0),
            unsubscribe: Arc::default(),
        }
    }

    /// Registers for `channel`, subscribing first if needed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a registration cancelled while its `SUBSCRIBE` is in flight is dropped,
    /// and its channel unsubscribed, like any other.
    pub(crate) async fn register(&self, channel: String) -> Result<Registration> {
        let mut slot = self.conn.lock().await;
        let generation = self.primary.generation();
        if slot
            .as_ref()
            .is_some_and(|c| !c.alive.load(Ordering::SeqCst) || c.generation != generation)
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
            unsubscribe: self.unsubscribe.clone(),
        };
        let mut subscribed = conn.subscribed.lock().await;
        // The reader may have found the connection dead before the registration was in the
        // list (it would then never be marked broken), or a subscribe that failed meanwhile
        // marked it dead: checked under the lock, after the registration went in.
        if !conn.alive.load(Ordering::SeqCst) {
            return Err(temporary("subscribe", "the pub/sub connection broke"));
        }
        // Recorded as sent before it is sent: if this is cancelled with the request on its way,
        // the dropped registration has the channel unsubscribed. Until the server confirms it,
        // every registration sends it again and waits for the confirmation (a repeated
        // SUBSCRIBE is harmless), so that none returns before it can hear a message.
        let confirmed = subscribed.entry(channel.clone()).or_insert(false);
        if !*confirmed {
            match tokio::time::timeout(self.timeout, conn.sink.subscribe(&channel)).await {
                Ok(Ok(())) => *confirmed = true,
                Ok(Err(e)) => {
                    conn.alive.store(false, Ordering::SeqCst);
                    self.primary.node_failed(&conn.client);
                    return Err(map("subscribe", e));
                }
                Err(_) => {
                    conn.alive.store(false, Ordering::SeqCst);
                    self.primary.node_failed(&conn.client);
                    return Err(temporary("subscribe", "timed out"));
                }
            }
        }
        drop(subscribed);
        Ok(reg)
    }

    async fn connect(&self) -> Result<Conn> {
        let (client, generation) = self.primary.client();
        // A cluster URL's next node may be a server without cluster mode, which hears none of
        // the cluster's messages: passed over as a node that failed. (The first was checked
        // at connect: a session's first wait pays no extra round trip.)
        if self.primary.on_unchecked_node() {
            let within = self.timeout.min(crate::primary::NODE_CHECK);
            if crate::connect::not_a_cluster_node(self.primary.config(), &client, within).await {
                tracing::warn!(node = %client.get_connection_info().addr(), "a node of the cluster URL runs without cluster mode: not used for pub/sub");
                self.primary.node_failed(&client);
                return Err(temporary(
                    "subscribe",
                    "a node of the URL is not a cluster node",
                ));
            }
        }
        // (On a cluster, a node that fails a connect has the next one tried from then on.)
        let pubsub = match tokio::time::timeout(self.timeout, client.get_async_pubsub()).await {
            Ok(r) => r.map_err(|e| {
                self.primary.node_failed(&client);
                self.primary.failed("subscribe", e)
            })?,
            Err(_) => {
                self.primary.node_failed(&client);
                return Err(temporary("subscribe", "connect timed out"));
            }
        };
        let (sink, mut stream) = pubsub.split();
        let alive = Arc::new(AtomicBool::new(true));
        let subscribed: Subscribed = Arc::default();
        let (regs, flag) = (self.regs.clone(), alive.clone());
        let (mut pinger, pong_within) = (sink.clone(), self.pong_within);
        let (primary, node) = (self.primary.clone(), client.clone());
        let ping_every = self.ping_every;
        let reader = tokio::spawn(async move {
            // A connection that died without a reset (a crashed host, a dropped NAT entry) or
            // whose server hangs delivers nothing and reports nothing: a ping finds it.
            let mut tick = tokio::time::interval(ping_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let msg = tokio::select! {
                    msg = stream.next() => msg,
                    _ = tick.tick() => {
                        // The primary moved (Sentinel): this server may still answer pings
                        // (demoted, or cut off from the others) but no longer hears the
                        // session's messages. Broken, the waits read again and subscribe
                        // on the new primary.
                        if primary.generation() != generation {
                            break;
                        }
                        let pong = tokio::time::timeout(pong_within, pinger.ping::<redis::Value>()).await;
                        if matches!(pong, Ok(Ok(_))) {
                            continue;
                        }
                        primary.node_failed(&node);
                        None
                    }
                };
                let Some(msg) = msg else { break };
                let regs = regs.lock().unwrap_or_else(|e| e.into_inner());
                let channel = msg.get_channel_name();
                if channel.starts_with(OWN_PREFIX) {
                    for (_, signal) in regs.by_channel.get(channel).into_iter().flatten() {
                        signal
                            .inbox
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .deliver(msg.get_payload_bytes());
                    }
                } else if let Some(list) = regs.by_channel.get(channel) {
                    let payload = msg.get_payload_bytes();
                    let gone = payload == b"gone" || payload.starts_with(b"gone ");
                    let head = payload
                        .strip_prefix(b"gone ")
                        .and_then(|h| std::str::from_utf8(h).ok())
                        .map(|h| match h.strip_suffix(" expired") {
                            Some(h) => (h, true),
                            None => (h, false),
                        })
                        .and_then(|(h, expired)| Some((h.rsplit_once(' ')?, expired)))
                        .and_then(|((name, token), expired)| {
                            Some((name, token.parse::<u64>().ok()?, expired))
                        });
                    for (_, signal) in list {
                        if gone {
                            if let Some((name, token, expired)) = head {
                                *signal.head.lock().unwrap_or_else(|e| e.into_inner()) =
                                    Some((name.to_string(), token, expired));
                            }
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
        let (unsubscribe, mut gone) = mpsc::unbounded_channel::<String>();
        let unsubscriber = tokio::spawn({
            let (regs, subscribed, flag) = (self.regs.clone(), subscribed.clone(), alive.clone());
            let (mut sink, timeout) = (sink.clone(), self.timeout);
            async move {
                while let Some(channel) = gone.recv().await {
                    let mut subs = subscribed.lock().await;
                    let wanted = regs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .by_channel
                        .contains_key(&channel);
                    if wanted || !subs.contains_key(&channel) {
                        continue;
                    }
                    match tokio::time::timeout(timeout, sink.unsubscribe(&channel)).await {
                        Ok(Ok(())) => {
                            subs.remove(&channel);
                        }
                        // A connection that cannot unsubscribe is replaced (its subscriptions
                        // go with it).
                        _ => flag.store(false, Ordering::SeqCst),
                    }
                }
            }
        });
        *self.unsubscribe.lock().unwrap_or_else(|e| e.into_inner()) = Some(unsubscribe);
        Ok(Conn {
            generation,
            client,
            sink,
            subscribed,
            alive,
            tasks: [reader.abort_handle(), unsubscriber.abort_handle()],
        })
    }

    /// Drops the pub/sub connection (the session is closing).
    pub(crate) async fn shutdown(&self) {
        *self.conn.lock().await = None;
        break_all(&self.regs);
    }
}
