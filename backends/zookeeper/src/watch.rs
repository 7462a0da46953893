//! Watches on entry nodes: how they are awaited, and what dropping them costs.

use fencelock::Result;
use zookeeper_client as zk;

use crate::error::state_error;

// A one-shot watch is awaited as `OneshotWatcher::changed()`; dropping that future before it
// fired removes the watch (zookeeper-client sends RemoveWatches once no other watcher of the
// client is left on the path). Every wait here relies on that: a dropped `lost()` or
// `revoke_requested()` must cost neither a task nor a server watch, even while its node stays.

/// A watch fired by a session event (a terminal state) ends the wait with the session's error.
pub(crate) fn check_session_event(op: &'static str, ev: &zk::WatchedEvent) -> Result<()> {
    if ev.event_type == zk::EventType::Session {
        if let Some(e) = state_error(op, ev.session_state) {
            return Err(e);
        }
    }
    Ok(())
}
