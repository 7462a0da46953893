//! One watch stream: opened on a member, its creates sent in order, its replies read, asked for
//! progress when quiet, and its watches moved to a new stream when it goes silent.

use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use etcd_client::{
    EventType, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponseStream,
};
use fencelock::backend::SessionEvent;
use fencelock::Result;
use tokio::sync::{mpsc, Mutex as AsyncMutex};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::error::{map, temporary, watch_refused};

use super::state::*;

pub(super) async fn read_loop(
    mut responses: WatchResponseStream,
    state: Arc<StdMutex<State>>,
    stream: Arc<StdMutex<Stream>>,
    sender: Arc<AsyncMutex<WatchRequestSender>>,
    events: mpsc::UnboundedSender<SessionEvent>,
) {
    let retire = stream.lock().unwrap().retire.clone();
    loop {
        let message = tokio::select! {
            m = responses.message() => m,
            // Given up: what it still carries (nothing once its watches moved) is failed.
            () = retire.notified() => break,
        };
        let resp = match message {
            Ok(Some(r)) => r,
            Ok(None) => {
                let _ = events.send(SessionEvent::Disconnected);
                break;
            }
            Err(e) => {
                debug!(error = %e, "watch stream broke");
                let _ = events.send(SessionEvent::Disconnected);
                break;
            }
        };
        let mut ss = stream.lock().unwrap();
        if ss.dead {
            break;
        }
        ss.heard = Instant::now();
        if let Some(h) = resp.header() {
            ss.member = Some(h.member_id());
        }
        let mut st = state.lock().unwrap();
        if resp.created() {
            let Some(create) = ss.pending.pop_front() else {
                continue;
            };
            let key = create.key;
            let ok = !resp.canceled();
            if ok {
                ss.ids.insert(resp.watch_id(), key.clone());
            }
            let Some(ks) = st.keys.get_mut(&key) else {
                // Nobody waits any more: the watch is not needed.
                if ok {
                    ss.ids.remove(&resp.watch_id());
                    cancel_later(&sender, resp.watch_id());
                }
                continue;
            };
            ks.moving = false;
            if !ok {
                if let Some(ks) = st.forget(&key) {
                    for c in ks.creating {
                        let _ = c.send(Err(watch_refused(resp.cancel_reason())));
                    }
                    for w in ks.waiters {
                        let _ = w.tx.send(Err(watch_refused(resp.cancel_reason())));
                    }
                }
                continue;
            }
            // A watch from now covers what follows the revision it was created at.
            let start = create
                .start
                .unwrap_or_else(|| resp.header().map_or(0, |h| h.revision()) + 1);
            ks.watch = Some(WatchRef {
                id: resp.watch_id(),
                stream: stream.clone(),
                sender: sender.clone(),
                start,
            });
            for c in ks.creating.drain(..) {
                let _ = c.send(Ok(()));
            }
            if !ks.needed() {
                // Every wait that asked for it was given up while it was being created: it
                // ends now, not at the key's next deletion.
                st.forget(&key);
                ss.ids.remove(&resp.watch_id());
                cancel_later(&sender, resp.watch_id());
            }
            continue;
        }
        if resp.canceled() {
            // A watch ended by the server (compaction) or by our cancel: its waiters re-read.
            if let Some(key) = ss.ids.remove(&resp.watch_id()) {
                let ours = st
                    .keys
                    .get(&key)
                    .and_then(|k| k.watch.as_ref())
                    .is_some_and(|w| w.id == resp.watch_id() && Arc::ptr_eq(&w.stream, &stream));
                if ours {
                    if let Some(ks) = st.forget(&key) {
                        ks.fail("watch canceled");
                    }
                }
            }
            continue;
        }
        for ev in resp.events() {
            if ev.event_type() != EventType::Delete {
                continue;
            }
            let Some(kv) = ev.kv() else { continue };
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            // Wake the key's waiters on entries created before this deletion (a kept watch
            // may deliver the deletion of the key's previous entry). A watch that woke someone
            // is kept for the next wait on the key; one that woke nobody ends: a session
            // watches only the keys it waits on, and at most one more (`State::idle`).
            let rev = kv.mod_revision();
            let Some(ks) = st.keys.get_mut(key) else {
                // A watch whose key has no state left (dropped where no runtime could cancel
                // it): it ends now, not at each later deletion of the key.
                if ss.ids.remove(&resp.watch_id()).is_some() {
                    cancel_later(&sender, resp.watch_id());
                }
                continue;
            };
            if let Some(w) = ks.watch.as_mut() {
                // It delivered everything up to here: a copy on a new stream starts after.
                w.start = w.start.max(rev + 1);
            }
            let (woken, waiting): (Vec<Waker>, Vec<Waker>) = std::mem::take(&mut ks.waiters)
                .into_iter()
                .partition(|w| w.after < rev);
            ks.waiters = waiting;
            // Every one is told (no short cut): a waiter left unsent would see an error.
            let woke = woken
                .into_iter()
                .fold(false, |woke, w| w.tx.send(Ok(())).is_ok() | woke);
            if ks.needed() {
                continue;
            }
            let ended = if woke {
                st.keep_idle(key)
            } else {
                st.forget(key).and_then(|ks| ks.watch)
            };
            if let Some(watch) = ended {
                if Arc::ptr_eq(&watch.stream, &stream) {
                    ss.ids.remove(&watch.id);
                    cancel_later(&sender, watch.id);
                } else {
                    tokio::spawn(watch.cancel());
                }
            }
        }
    }
    // The stream is gone: every key it carried (or was creating) re-reads through the core's
    // retry; keys on a newer stream are left alone.
    let mut ss = stream.lock().unwrap();
    ss.dead = true;
    let ss = &mut *ss;
    let mut keys: Vec<String> = ss.pending.drain(..).map(|c| c.key).collect();
    keys.extend(ss.ids.drain().map(|(_, k)| k));
    fail_keys(
        &state,
        keys.iter().map(String::as_str),
        "watch stream broke",
    );
}

/// Asks `stream` for progress whenever it carries watches and has been quiet for half the
/// request bound; a stream that then stays silent for the bound is handed to the [`mover`].
/// Ends with the stream, or with the watcher.
///
/// etcd answers a progress request at once, from the member itself (no consensus involved),
/// so silence means the member, or the path to it, hangs.
pub(super) async fn supervise(
    inner: Weak<Inner>,
    stream: Arc<StdMutex<Stream>>,
    sender: Arc<AsyncMutex<WatchRequestSender>>,
    bound: Duration,
) {
    let quiet = bound / 2;
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let (heard, busy) = {
            let mut ss = stream.lock().unwrap();
            if ss.dead {
                return;
            }
            let mut st = strong.state.lock().unwrap();
            // The kept watch is for a queue that is busy right now: unused for a while, it
            // goes (within one to two `quiet` periods), so that a session that waited once
            // leaves no watch behind on the server.
            let stale = st.idle_since.is_some_and(|t| t + quiet <= Instant::now());
            if let (true, Some(key)) = (stale, st.idle.clone()) {
                let here = st.keys.get(&key).is_some_and(|ks| {
                    ks.watch
                        .as_ref()
                        .is_some_and(|w| Arc::ptr_eq(&w.stream, &stream))
                });
                if here {
                    if let Some(w) = st.forget(&key).and_then(|ks| ks.watch) {
                        ss.ids.remove(&w.id);
                        cancel_later(&sender, w.id);
                    }
                }
            }
            (ss.heard, ss.busy(&st))
        };
        drop(strong);
        let now = Instant::now();
        if !busy || now < heard + quiet {
            tokio::time::sleep_until(if busy { heard + quiet } else { now + quiet }).await;
            continue;
        }
        let asked = Instant::now();
        let sent = tokio::time::timeout(bound, async {
            sender.lock().await.request_progress().await
        })
        .await;
        if let Ok(Err(_)) = sent {
            // The stream is closed: its reader reports it.
            return;
        }
        tokio::time::sleep_until(asked + bound).await;
        let silent = {
            let ss = stream.lock().unwrap();
            if ss.dead {
                return;
            }
            ss.heard < asked
        };
        if silent {
            let Some(inner) = inner.upgrade() else { return };
            info!("etcd watch stream silent for {bound:?}: its watches move to a new stream");
            let _ = inner.moves.send(stream);
            return;
        }
    }
}

/// Moves the watches of each silent stream it is handed (see [`move_watches`]), one stream at
/// a time, for as long as the watcher lives.
pub(super) async fn mover(
    inner: Weak<Inner>,
    mut silent: mpsc::UnboundedReceiver<Arc<StdMutex<Stream>>>,
) {
    while let Some(stream) = silent.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        move_watches(&inner, &stream).await;
    }
}

/// Gives up `old` (silent) and creates its watches again on the current stream, or a new one
/// on a member that answers: each from the revision it covered from, so that a deletion the
/// old stream did not deliver is delivered now. Its waiters keep waiting. If no stream can be
/// had, they are told (temporary): they re-read and register again.
pub(super) async fn move_watches(inner: &Arc<Inner>, old: &Arc<StdMutex<Stream>>) {
    let mut conn = inner.conn.lock().await;
    let (member, creates) = {
        let mut ss = old.lock().unwrap();
        if ss.dead {
            return;
        }
        ss.dead = true;
        ss.retire.notify_one();
        let mut st = inner.state.lock().unwrap();
        let mut creates = Vec::new();
        for (_, key) in ss.ids.drain() {
            let Some(ks) = st.keys.get_mut(&key) else {
                continue;
            };
            if !ks.needed() {
                // The kept watch (`State::idle`), which nobody waits on: not worth a move.
                st.forget(&key);
                continue;
            }
            if let Some(w) = ks.watch.take_if(|w| Arc::ptr_eq(&w.stream, old)) {
                ks.moving = true;
                creates.push(Create {
                    key,
                    start: Some(w.start),
                });
            }
        }
        // Creates not answered yet: their registrations have not returned, so a watch from
        // now on the new stream is what they asked for.
        for create in ss.pending.drain(..) {
            if let Some(ks) = st.keys.get_mut(&create.key) {
                ks.moving = true;
                creates.push(create);
            }
        }
        (ss.member, creates)
    };
    if conn.as_ref().is_some_and(|c| Arc::ptr_eq(&c.stream, old)) {
        *conn = None;
    }
    // Out of the rotation first, so that the new stream is opened elsewhere.
    if let Some(member) = member {
        inner.rotation.suspect(&inner.client, member).await;
    }
    if creates.is_empty() {
        return;
    }
    let keys: Vec<String> = creates.iter().map(|c| c.key.clone()).collect();
    if let Err(e) = send_creates(inner, &mut conn, creates).await {
        debug!(error = %e, "cannot move the watches to a new stream");
        fail_keys(
            &inner.state,
            keys.iter().map(String::as_str),
            &e.to_string(),
        );
    }
}

pub(super) fn options(start: Option<i64>) -> WatchOptions {
    let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    match start {
        Some(rev) => options.with_start_revision(rev),
        None => options,
    }
}

/// Sends `creates` on the current stream, or opens one with them (the current one is dead or
/// there is none). Each step waits at most the request bound: a stream sent to a member that
/// hangs is given up, and the caller's retry goes elsewhere.
pub(super) async fn send_creates(
    inner: &Arc<Inner>,
    conn: &mut Option<Conn>,
    creates: Vec<Create>,
) -> Result<()> {
    let live = conn
        .as_ref()
        .is_some_and(|c| !c.stream.lock().unwrap().dead);
    let creates = if live {
        creates
    } else {
        open_stream(inner, conn, creates).await?
    };
    if let Some(c) = conn.as_ref() {
        let (sender, stream) = (c.sender.clone(), c.stream.clone());
        for create in creates {
            let (key, start) = (create.key.clone(), create.start);
            {
                let mut ss = stream.lock().unwrap();
                if ss.dead {
                    return Err(temporary("watch", "watch stream broke"));
                }
                ss.pending.push_back(create);
            }
            let sent = tokio::time::timeout(inner.bound, async {
                sender
                    .lock()
                    .await
                    .watch(key.as_str(), Some(options(start)))
                    .await
            })
            .await;
            let failed = match sent {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => map("watch", e),
                Err(_) => temporary("watch", "the watch stream takes no request"),
            };
            // The stream is given up: its reader fails what it carries (the caller this key).
            let mut ss = stream.lock().unwrap();
            ss.pending.retain(|c| c.key != key);
            ss.dead = true;
            ss.retire.notify_one();
            drop(ss);
            *conn = None;
            return Err(failed);
        }
    }
    Ok(())
}

/// Opens a stream (in `conn`) with the first of `creates` as its first request; returns the
/// others, to be sent on it.
pub(super) async fn open_stream(
    inner: &Arc<Inner>,
    conn: &mut Option<Conn>,
    creates: Vec<Create>,
) -> Result<Vec<Create>> {
    if inner.shut.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(temporary("watch", "the session is closed"));
    }
    let mut creates = creates.into_iter();
    let Some(first) = creates.next() else {
        return Ok(Vec::new());
    };
    let stream = Arc::new(StdMutex::new(Stream::new()));
    let (key, start) = (first.key.clone(), first.start);
    stream.lock().unwrap().pending.push_back(first);
    let mut watches = inner.client.watch_client();
    let opened = watches.watch(key.as_str(), Some(options(start)));
    let ws = match tokio::time::timeout(inner.bound, opened).await {
        Ok(ws) => ws.map_err(|e| map("watch", e))?,
        Err(_) => return Err(temporary("watch", "the new watch stream was not answered")),
    };
    let (sender, responses) = ws.split();
    let sender = Arc::new(AsyncMutex::new(sender));
    tokio::spawn(read_loop(
        responses,
        inner.state.clone(),
        stream.clone(),
        sender.clone(),
        inner.events.clone(),
    ));
    *conn = Some(Conn {
        sender: sender.clone(),
        stream: stream.clone(),
    });
    // Shut while this stream opened (`shut` found the lock held): retired at once.
    if inner.shut.load(std::sync::atomic::Ordering::SeqCst) {
        retire(conn);
        return Err(temporary("watch", "the session is closed"));
    }
    tokio::spawn(supervise(
        Arc::downgrade(inner),
        stream,
        sender,
        inner.bound,
    ));
    Ok(creates.collect())
}
