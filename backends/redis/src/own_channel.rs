//! A session's own channel (`fencelock:w:{sid}`, see [`crate::layout`]): registered at the
//! session's first wait and kept while the session lives. A deletion names there the session's
//! entry right behind the deleted one, so a wait whose read (the enqueue, or a read of what is
//! ahead) was sent while the channel was already heard needs no subscription and no read of
//! its own: the predecessor's deletion cannot be missed, and its session's expiry (which sends
//! nothing) is looked at when the read said it would come. A wait whose read was not covered
//! (the session's first, or the first after the pub/sub connection broke or the primary
//! moved) subscribes to its predecessor's channel and reads, as before.

pub(crate) mod inbox;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use fencelock::backend::Entry;
use fencelock::Result;
use tokio::sync::Mutex as AsyncMutex;

use crate::layout::chan_own;
use crate::watch::{Notifier, Registration};

/// The most reads remembered (a read is forgotten by the wait that follows it, or when its
/// entry goes; a session that enqueues without waiting never grows past this).
const READS: usize = 4096;

/// The channel, and the reads it covers.
#[derive(Default)]
pub(crate) struct OwnChannel {
    heard: StdMutex<Option<Heard>>,
    registering: AsyncMutex<()>,
    epochs: AtomicU64,
    /// By own entry name: what its last covered read said.
    reads: StdMutex<HashMap<String, Read>>,
}

/// The registration heard now: the `epoch`-th, made while the primary was at `generation`.
struct Heard {
    epoch: u64,
    generation: u64,
    reg: Arc<Registration>,
}

/// What a read of an entry's queue, sent while registration `epoch` was heard, said.
#[derive(Clone, Copy)]
struct Read {
    token: u64,
    epoch: u64,
    /// The time left to the session of the entry ahead.
    left: Duration,
}

impl OwnChannel {
    /// The registration heard now (not broken, and made while the primary was at
    /// `generation`), with its epoch.
    fn current(&self, generation: u64) -> Option<(u64, Arc<Registration>)> {
        self.heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|h| h.generation == generation && !h.reg.is_broken())
            .map(|h| (h.epoch, h.reg.clone()))
    }

    /// The registration heard now, if any (made while the primary was at `generation`).
    pub(crate) fn heard(&self, generation: u64) -> Option<Arc<Registration>> {
        self.current(generation).map(|(_, reg)| reg)
    }

    /// The epoch a read sent now is covered by, if any: taken before the read is sent.
    pub(crate) fn epoch(&self, generation: u64) -> Option<u64> {
        self.current(generation).map(|(epoch, _)| epoch)
    }

    /// Records what a read of `own`'s queue said, sent while `epoch` was heard: the nearest
    /// entry ahead (of any kind) has its session's key `left_ms` more ms (-2: gone already; -1:
    /// not asked, or nothing ahead: nothing to record).
    pub(crate) fn record(&self, own: &Entry, epoch: Option<u64>, left_ms: Option<i64>) {
        let (Some(epoch), Some(left_ms)) = (epoch, left_ms) else {
            return;
        };
        let left = match left_ms {
            -2 => Duration::ZERO,
            ms if ms >= 0 => Duration::from_millis(ms as u64),
            _ => return,
        };
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        if reads.len() >= READS && !reads.contains_key(&own.key) {
            reads.clear();
        }
        reads.insert(
            own.key.clone(),
            Read {
                token: own.token.get(),
                epoch,
                left,
            },
        );
    }

    /// The registration that covers the last read of `own` (it was heard when the read was
    /// sent, and has been since), and the time left to the predecessor's session; the record
    /// is used up.
    pub(crate) fn covering(
        &self,
        own: &Entry,
        generation: u64,
    ) -> Option<(Arc<Registration>, Duration)> {
        let read = self
            .reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&own.key)
            .filter(|r| r.token == own.token.get())?;
        let (epoch, reg) = self.current(generation)?;
        (epoch == read.epoch).then_some((reg, read.left))
    }

    /// Forgets entry `name` up to token `upto` (released; any token if `None`: abandoned), its
    /// read and the messages to it: a later entry of the same name keeps its own.
    pub(crate) fn forget(&self, name: &str, upto: Option<u64>) {
        let older = |token: u64| upto.is_none_or(|u| token <= u);
        {
            let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
            if reads.get(name).is_some_and(|r| older(r.token)) {
                reads.remove(name);
            }
        }
        if let Some(h) = self
            .heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            h.reg.forget(name, upto);
        }
    }

    /// Registers the channel of session `sid` unless it is heard at `generation` already.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a registration cancelled on its way is dropped (and unsubscribed).
    pub(crate) async fn ensure(
        &self,
        notifier: &Notifier,
        sid: &str,
        generation: u64,
    ) -> Result<()> {
        let _one = self.registering.lock().await;
        if self.current(generation).is_some() {
            return Ok(());
        }
        let reg = notifier.register(chan_own(sid)).await?;
        let epoch = self.epochs.fetch_add(1, Ordering::Relaxed) + 1;
        *self.heard.lock().unwrap_or_else(|e| e.into_inner()) = Some(Heard {
            epoch,
            generation,
            reg: Arc::new(reg),
        });
        Ok(())
    }
}
