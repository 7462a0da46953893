//! The inbox of a session's own channel: the messages that name its entries (`NAME TOKEN
//! head|expired|ahead`: the entry ahead of NAME was deleted), kept until the entry's wait
//! asks, and the waits listening, each woken only by a message that names it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use fencelock::Result;
use tokio::sync::Notify;

use crate::error::temporary;

/// How many messages an inbox keeps for waits that have not asked yet.
const INBOX: usize = 4096;

/// What a message told the entry it names: the entry ahead of it was deleted, and then…
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Word {
    /// …something is still ahead (`ahead`): the core reads the queue.
    Ahead,
    /// …it heads the queue (`head`), by its owner's release or abandon.
    Head,
    /// …it heads the queue (`expired`), because the entry ahead expired and was dropped (see
    /// [`crate::expired`]).
    Expired,
}

/// A session's own channel's messages, and its waits.
#[derive(Default)]
pub(crate) struct Inbox {
    /// The entries (name, token) a deletion ahead of them was reported to, and what it told
    /// them, oldest first (at most [`INBOX`]): kept until their wait asks.
    arrived: VecDeque<(String, u64, Word)>,
    /// The waits listening, by entry: a message wakes the one it names (no herd of the
    /// session's other waits).
    waiting: HashMap<(String, u64), Arc<Notify>>,
}

impl Inbox {
    /// Keeps the message `payload` (ignored unless it has the shape above) and wakes its wait.
    pub(crate) fn deliver(&mut self, payload: &[u8]) {
        let Some((name, token, word)) = parse(payload) else {
            return;
        };
        if self.arrived.len() >= INBOX {
            self.arrived.pop_front();
        }
        if let Some(waiter) = self.waiting.get(&(name.clone(), token)) {
            waiter.notify_one();
        }
        self.arrived.push_back((name, token, word));
    }

    /// Wakes every wait (the connection broke).
    pub(crate) fn wake_all(&self) {
        for waiter in self.waiting.values() {
            waiter.notify_one();
        }
    }

    /// Forgets the messages to entry `name` up to token `upto` (any, if `None`): it is gone,
    /// and late ones would only fill the inbox.
    pub(crate) fn forget(&mut self, name: &str, upto: Option<u64>) {
        self.arrived
            .retain(|(n, t, _)| n != name || upto.is_some_and(|u| *t > u));
    }

    fn take(&mut self, name: &str, token: u64) -> Option<Word> {
        let i = self
            .arrived
            .iter()
            .position(|(n, t, _)| n == name && *t == token)?;
        self.arrived.remove(i).map(|(_, _, word)| word)
    }
}

/// `NAME TOKEN head`, `NAME TOKEN expired` or `NAME TOKEN ahead` (names may hold spaces: read
/// from the right).
fn parse(payload: &[u8]) -> Option<(String, u64, Word)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (rest, what) = text.rsplit_once(' ')?;
    let (name, token) = rest.rsplit_once(' ')?;
    let word = match what {
        "head" => Word::Head,
        "expired" => Word::Expired,
        "ahead" => Word::Ahead,
        _ => return None,
    };
    Some((name.to_string(), token.parse().ok()?, word))
}

/// Removes a wait from the listeners when it ends (returns, fails or is cancelled).
struct Listening<'a> {
    inbox: &'a StdMutex<Inbox>,
    key: (String, u64),
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        lock(self.inbox).waiting.remove(&self.key);
    }
}

fn lock(inbox: &StdMutex<Inbox>) -> std::sync::MutexGuard<'_, Inbox> {
    inbox.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits for a message to entry `name` with token `token` in `inbox`, and returns what it
/// told; `None` if `until` passed first. Fails with a temporary error
/// once `broken` is set (the connection broke: messages since are lost).
///
/// # Cancel safety
///
/// Cancel safe: a message stays in the inbox until a call takes it.
pub(crate) async fn news(
    inbox: &StdMutex<Inbox>,
    broken: &AtomicBool,
    name: &str,
    token: u64,
    until: tokio::time::Instant,
) -> Result<Option<Word>> {
    let wake = Arc::new(Notify::new());
    let key = (name.to_string(), token);
    {
        let mut held = lock(inbox);
        if let Some(word) = held.take(name, token) {
            return Ok(Some(word));
        }
        held.waiting.insert(key.clone(), wake.clone());
    }
    let _listening = Listening { inbox, key };
    loop {
        // Enabled before the inbox is read: a message that arrives in between wakes it.
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if broken.load(Ordering::SeqCst) {
            return Err(temporary("wait", "the pub/sub connection broke"));
        }
        let arrived = lock(inbox).take(name, token);
        if let Some(word) = arrived {
            return Ok(Some(word));
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(until) => return Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_says_what_the_deletion_left() {
        assert_eq!(
            parse(b"ns/m/a b 7 head"),
            Some(("ns/m/a b".to_string(), 7, Word::Head))
        );
        assert_eq!(
            parse(b"ns/m/a 7 expired"),
            Some(("ns/m/a".to_string(), 7, Word::Expired))
        );
        assert_eq!(
            parse(b"ns/m/a 7 ahead"),
            Some(("ns/m/a".to_string(), 7, Word::Ahead))
        );
        assert_eq!(parse(b"ns/m/a 7 granted"), None);
        assert_eq!(parse(b"ns/m/a x head"), None);
        assert_eq!(parse(b"head"), None);
    }
}
