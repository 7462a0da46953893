//! The work that dropped guards and cancelled acquisitions hand to the session's background
//! task (`cleanup.rs` carries it out): what may have been created, and the local queue slot that
//! must not be given to the next local waiter before the remote entry is gone.

use tokio::sync::oneshot;

use super::local::LocalSlot;
use super::undo::Undo;

/// Work for the session's background task.
pub(crate) enum Cleanup {
    /// Take back what an attempt or a released grant left ([`Undo`]), then free its local
    /// queue slots: the next local waiter cannot start before the remote entry is gone.
    Undo { undo: Undo, locals: Vec<LocalSlot> },
    /// Answer once every earlier item is done.
    Flush(oneshot::Sender<()>),
}
