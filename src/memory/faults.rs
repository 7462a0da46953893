//! Fault injection (most of it behind the feature `testing`): sessions expired at once, replies
//! lost after their request was carried out, keys written or deleted as another tool would.

#[cfg(feature = "testing")]
use super::cluster::Record;
use super::{Inner, MemoryBackend, NAME};
#[cfg(feature = "testing")]
use crate::backend::EntryKind;
use crate::{Error, Result};

/// A kind of request to the memory backend, for its fault injection
/// (`MemoryBackend::stop_before_next_reply`, feature `testing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// A session's start.
    Open,
    /// An enqueue, or a multi-lock's all-or-nothing create.
    Create,
    /// A read of a queue (`inspect`).
    Inspect,
}

impl MemoryBackend {
    /// Expires session `id` (as given by [`crate::Session::id`]) at once, as an operator
    /// revoking an etcd lease would: its entries go, and the session is told at once
    /// (`Lost(Expired)`, as by etcd's keep-alive stream). For tests of expiry handling.
    /// (A missed TTL plays differently: the session stops confirming heartbeats and declares
    /// itself lost at its local deadline, before the cluster expires it; see
    /// `hold_keep_alives`, feature `testing`.) Returns whether it was alive.
    pub fn expire_session(&self, id: &str) -> bool {
        let Ok(id) = u64::from_str_radix(id, 16) else {
            return false;
        };
        let mut st = self.inner.state.lock().unwrap();
        let alive = st.sessions.get(&id).is_some_and(|s| s.alive);
        if alive {
            st.kill(id);
            self.inner.notify(&st);
        }
        alive
    }

    /// Fault injection: the next `n` create requests (an enqueue, or a multi-lock's
    /// all-or-nothing create) are carried out, then answered with a temporary error, as when
    /// the cluster committed a request whose reply was lost. For tests of the
    /// create-succeeded-but-reply-lost case.
    #[cfg(feature = "testing")]
    pub fn lose_create_replies(&self, n: usize) {
        self.inner
            .lost_replies
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Fault injection: the next request of kind `op` is carried out,
    /// then the thread it runs on stops for `pause` (a blocking sleep) before it answers: on a
    /// current-thread runtime, a process stopped (`SIGSTOP`, a long pause) with the reply on its
    /// way, its timers stopped with it. For tests that no result of a request is used past the
    /// local deadline.
    #[cfg(feature = "testing")]
    pub fn stop_before_next_reply(&self, op: Request, pause: std::time::Duration) {
        *self.inner.stop_before.lock().unwrap() = Some((op, pause));
    }

    /// Fault injection: while `on`, reads of queues and listings (`inspect`, `head`, `list`)
    /// fail with a temporary error and the rest works, heartbeats included: a shard of a Redis
    /// Cluster that stays away, under a session that holds nothing there.
    #[cfg(feature = "testing")]
    pub fn fail_reads(&self, on: bool) {
        self.inner
            .reads_fail
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Fault injection: the next `n` removals of an entry (a release) are carried out, then
    /// answered with a temporary error, as when the reply of a committed delete was lost.
    #[cfg(feature = "testing")]
    pub fn lose_remove_replies(&self, n: usize) {
        self.inner
            .lost_remove_replies
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Fault injection: the next `n` removals of an entry (a release, the undo of a wait that
    /// gave up) are refused with a permanent error ([`Error::PermissionDenied`]), nothing
    /// removed, as by a cluster whose permissions changed.
    #[cfg(feature = "testing")]
    pub fn refuse_removes(&self, n: usize) {
        self.inner
            .refused_removes
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Fault injection: from now on keep-alives wait, unanswered, until
    /// [`release_keep_alives`](Self::release_keep_alives) (a cluster that takes its time: the
    /// session's heartbeat is in flight meanwhile).
    #[cfg(feature = "testing")]
    pub fn hold_keep_alives(&self) {
        self.inner
            .hold_keep_alives
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Fault injection: every session hears of a connection break
    /// ([`SessionEvent::Disconnected`](crate::backend::SessionEvent::Disconnected), as from a
    /// link or a member that keeps resetting streams) while its keep-alives go on being
    /// answered: it is `Suspended` until a heartbeat confirms it.
    #[cfg(feature = "testing")]
    pub fn report_disconnect(&self) {
        self.inner.disconnects.send_modify(|n| *n += 1);
    }

    /// Resolves when a keep-alive held by [`hold_keep_alives`](Self::hold_keep_alives) starts
    /// waiting.
    #[cfg(feature = "testing")]
    pub async fn keep_alive_held(&self) {
        self.inner.keep_alive_held.notified().await
    }

    /// Ends [`hold_keep_alives`](Self::hold_keep_alives): the waiting keep-alives are answered.
    #[cfg(feature = "testing")]
    pub fn release_keep_alives(&self) {
        self.inner
            .hold_keep_alives
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.inner.keep_alives_released.notify_waiters();
    }

    /// **Testing only** (feature `testing`): whether session `id` (as
    /// [`Session::id`](crate::Session::id) gives) is alive on this cluster.
    #[cfg(feature = "testing")]
    pub fn session_alive(&self, id: &str) -> bool {
        let Ok(id) = u64::from_str_radix(id, 16) else {
            return false;
        };
        let st = self.inner.state.lock().unwrap();
        st.sessions.get(&id).is_some_and(|s| s.alive)
    }

    /// Resolves at the next reply lost by [`lose_create_replies`](Self::lose_create_replies)
    /// or [`lose_remove_replies`](Self::lose_remove_replies).
    #[cfg(feature = "testing")]
    pub async fn reply_lost(&self) {
        self.inner.reply_lost.notified().await
    }

    /// **Testing only** (feature `testing`): writes `key` as another tool would, bypassing
    /// fencelock's names (say `{namespace}/jobs//{session}`, the key `etcdctl lock` makes
    /// for a prefix ending in `/`), owned by session `session` (an id as
    /// [`Session::id`](crate::Session::id) gives) so that it goes with it. Returns whether
    /// that session is alive and the key was written.
    #[cfg(feature = "testing")]
    pub fn put_foreign_key(&self, key: &str, session: &str) -> bool {
        let Ok(session) = u64::from_str_radix(session, 16) else {
            return false;
        };
        let mut st = self.inner.lock();
        if st.alive(session).is_err() {
            return false;
        }
        st.revision += 1;
        let record = Record {
            create_rev: st.revision,
            session,
            kind: EntryKind::Exclusive,
            value: Vec::new(),
        };
        st.entries.insert(key.to_string(), record);
        self.inner.notify(&st);
        true
    }

    /// Deletes the entry at `key` as an outsider would (an operator with a CLI): its holder's
    /// `lost()` fires with [`LostReason::EntryDeleted`](crate::LostReason::EntryDeleted).
    /// Returns whether it existed.
    pub fn delete_key(&self, key: &str) -> bool {
        let mut st = self.inner.lock();
        let existed = st.entries.remove(key).is_some();
        if existed {
            st.revision += 1;
            self.inner.notify(&st);
        }
        existed
    }
}

impl Inner {
    /// A temporary error while reads fail (see [`MemoryBackend::fail_reads`]).
    pub(super) fn read_fails(&self) -> Result<()> {
        if self.reads_fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::backend(
                NAME,
                "read",
                true,
                "no answer (fault injection)",
            ));
        }
        Ok(())
    }

    /// Stops the thread before the reply of this `op` if asked (see
    /// [`MemoryBackend::stop_before_next_reply`]).
    pub(super) fn stop_before_reply(&self, op: Request) {
        let pause = {
            let mut asked = self.stop_before.lock().unwrap();
            match *asked {
                Some((o, _)) if o == op => asked.take().map(|(_, p)| p),
                _ => None,
            }
        };
        if let Some(pause) = pause {
            std::thread::sleep(pause);
        }
    }

    /// Whether the reply of this `op` (counted down in `counter`) is to be lost (see
    /// [`MemoryBackend::lose_create_replies`]).
    pub(super) fn lose_reply(
        &self,
        counter: &std::sync::atomic::AtomicUsize,
        op: &'static str,
    ) -> Result<()> {
        use std::sync::atomic::Ordering;
        let lose = counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            self.reply_lost.notify_one();
            return Err(Error::backend(
                NAME,
                op,
                true,
                "reply lost (fault injection)",
            ));
        }
        Ok(())
    }
}
