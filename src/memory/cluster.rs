//! The simulated cluster: sessions with their expiry, entries with their create revision, the
//! revision counter, and the queue reads every operation is made of.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::Inner;
use crate::backend::{EnqueueRequest, Entry, EntryKind, Peer, QueueId, QueueKind};
use crate::{Error, FencingToken, Result, SessionEnd};

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) revision: u64,
    pub(super) next_session: u64,
    pub(super) sessions: HashMap<u64, Sess>,
    pub(super) entries: BTreeMap<String, Record>,
}

#[derive(Debug)]
pub(super) struct Sess {
    pub(super) ttl: Duration,
    pub(super) expires: Instant,
    pub(super) alive: bool,
}

#[derive(Debug, Clone)]
pub(super) struct Record {
    pub(super) create_rev: u64,
    pub(super) session: u64,
    pub(super) kind: EntryKind,
    pub(super) value: Vec<u8>,
}

impl Inner {
    pub(super) fn notify(&self, st: &State) {
        self.changed.send_replace(st.revision);
    }

    /// Locks the state after expiring every session past its TTL.
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        let mut st = self.state.lock().unwrap();
        let now = Instant::now();
        let due: Vec<u64> = st
            .sessions
            .iter()
            .filter(|(_, s)| s.alive && s.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        if !due.is_empty() {
            for id in due {
                st.kill(id);
            }
            self.notify(&st);
        }
        st
    }
}

impl State {
    pub(super) fn kill(&mut self, id: u64) {
        // Forgotten, not kept as dead: a long test that opens and loses sessions (a Supervisor's
        // churn) must not slow every later request down, nor grow (an unknown session is dead).
        self.sessions.remove(&id);
        let before = self.entries.len();
        self.entries.retain(|_, r| r.session != id);
        if self.entries.len() != before {
            self.revision += 1;
        }
    }

    pub(super) fn alive(&self, id: u64) -> Result<()> {
        match self.sessions.get(&id) {
            Some(s) if s.alive => Ok(()),
            _ => Err(Error::SessionLost(SessionEnd::Expired)),
        }
    }

    /// The entries directly in `queue`, in queue order.
    pub(super) fn queue(&self, queue: &QueueId) -> Vec<(String, Record)> {
        let prefix = format!("{}/", queue.path());
        let mut v: Vec<_> = self
            .entries
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(k, _)| in_queue(queue.kind, &k[prefix.len()..]))
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        v.sort_by_key(|(_, r)| r.create_rev);
        v
    }

    pub(super) fn same(&self, key: &str, order: u64) -> Option<&Record> {
        self.entries.get(key).filter(|r| r.create_rev == order)
    }

    /// Creates `key` in `queue` for `session` unless it exists; returns it with the entries
    /// ahead of it.
    pub(super) fn enqueue(
        &mut self,
        session: u64,
        req: &EnqueueRequest<'_>,
        key: &str,
    ) -> (Entry, Vec<Peer>) {
        if !self.entries.contains_key(key) {
            self.revision += 1;
            let record = Record {
                create_rev: self.revision,
                session,
                kind: req.kind,
                value: req.value.to_vec(),
            };
            self.entries.insert(key.to_string(), record);
        }
        let own = self.entries[key].clone();
        let ahead = self
            .queue(req.queue)
            .into_iter()
            .filter(|(_, r)| r.create_rev < own.create_rev)
            .map(|(k, r)| peer(k, &r))
            .collect();
        (entry(key.to_string(), &own), ahead)
    }
}

/// Whether `rest` (a key below a queue's prefix) names an entry of a `kind` queue: `{session}`
/// directly, or `read/{..}` / `write/{..}` in a read-write lock.
pub(super) fn in_queue(kind: QueueKind, rest: &str) -> bool {
    match kind {
        QueueKind::ReadWrite => match rest.split_once('/') {
            Some(("read" | "write", id)) => !id.is_empty() && !id.contains('/'),
            _ => false,
        },
        _ => !rest.is_empty() && !rest.contains('/'),
    }
}

pub(super) fn entry(key: String, r: &Record) -> Entry {
    Entry {
        key,
        token: FencingToken::new(r.create_rev),
        order: r.create_rev,
        kind: r.kind,
    }
}

pub(super) fn peer(key: String, r: &Record) -> Peer {
    Peer {
        key,
        order: r.create_rev,
        kind: r.kind,
    }
}
