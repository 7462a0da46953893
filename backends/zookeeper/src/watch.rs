//! Watches on entry nodes: how they are awaited, and what dropping them costs.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use fencelock::Result;
use zookeeper_client as zk;

use crate::error::state_error;

/// A one-shot watch awaited. When `keep` is set and it is dropped before it fired (a wait given
/// up because its node is about to be deleted), it is not
/// removed from the server, which would cost a RemoveWatches request sent ahead of the delete
/// that follows, but left to fire in a task of its own, which ends as soon as the node goes (or
/// the session). Otherwise it is removed when dropped, as usual.
pub(crate) struct KeptWatch {
    fired: Option<Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>>,
    keep: bool,
}

impl KeptWatch {
    pub(crate) fn new(watch: zk::OneshotWatcher, keep: bool) -> Self {
        KeptWatch {
            fired: Some(Box::pin(watch.changed())),
            keep,
        }
    }

    /// Removes the watch when dropped after all (a wait that failed: its retry watches
    /// afresh, so repeated failures leave no watches behind).
    pub(crate) fn discard(&mut self) {
        self.keep = false;
    }
}

impl Future for KeptWatch {
    type Output = zk::WatchedEvent;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<zk::WatchedEvent> {
        let fired = self
            .fired
            .as_mut()
            .expect("KeptWatch polled after it fired");
        let ev = ready!(fired.as_mut().poll(cx));
        self.fired = None;
        Poll::Ready(ev)
    }
}

impl Drop for KeptWatch {
    fn drop(&mut self) {
        let Some(fired) = self.fired.take() else {
            return;
        };
        if let (true, Ok(rt)) = (self.keep, tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                fired.await;
            });
        }
    }
}

/// A watch fired by a session event (a terminal state) ends the wait with the session's error.
pub(crate) fn check_session_event(op: &'static str, ev: &zk::WatchedEvent) -> Result<()> {
    if ev.event_type == zk::EventType::Session {
        if let Some(e) = state_error(op, ev.session_state) {
            return Err(e);
        }
    }
    Ok(())
}
