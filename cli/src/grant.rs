//! What the command runs under: a held lock or a leadership, and what `child` asks of it.

use std::time::Duration;

use fencelock::{Error, FencingToken, Guard, Leadership, LostReason};

/// What the command runs under.
pub(crate) enum Grant {
    /// A held lock.
    Lock(Guard),
    /// A leadership.
    Leader(Leadership),
}

impl Grant {
    pub(crate) fn token(&self) -> FencingToken {
        match self {
            Grant::Lock(g) => g.token(),
            Grant::Leader(l) => l.epoch(),
        }
    }

    pub(crate) fn key(&self) -> &str {
        match self {
            Grant::Lock(g) => g.key(),
            Grant::Leader(l) => l.key(),
        }
    }

    pub(crate) fn what(&self) -> &'static str {
        match self {
            Grant::Lock(_) => "lock",
            Grant::Leader(_) => "leadership",
        }
    }

    pub(crate) fn lost(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = LostReason> + Send>> {
        match self {
            Grant::Lock(g) => Box::pin(g.lost()),
            Grant::Leader(l) => Box::pin(l.lost()),
        }
    }

    /// When the keeper kills the tree unless told a later instant (see
    /// [`crate::keeper::Keeper::hold_until`]): the session's local deadline, when fencelock
    /// kills the tree itself and closes the session after it; a fencelock stopped or stuck
    /// does neither, and the cluster expires the session a margin later. (Half a margin later,
    /// a fencelock continued in between, the command with it, closed the session before its
    /// own kill landed: the command ran 0.3-4 ms beside the next holder, black-box round 9.)
    /// A heartbeat confirmed within milliseconds of the deadline reaches the keeper too late
    /// (fencelock looks every 5 ms near it): the tree of a live session is then killed,
    /// safely (exit 76, said), where waiting would not be safe.
    pub(crate) fn deadline(&self) -> tokio::time::Instant {
        match self {
            Grant::Lock(g) => g.session().deadline(),
            Grant::Leader(l) => l.session().deadline(),
        }
    }

    pub(crate) fn is_held(&self) -> bool {
        match self {
            Grant::Lock(g) => g.is_held(),
            Grant::Leader(l) => l.is_leader(),
        }
    }

    /// Releases (resigns), bounded by `within`. `Err` with the reason if the grant turned out
    /// to be lost already; a failure to reach the cluster is reported on stderr and counts as
    /// released (the session's close or its TTL removes the entry).
    pub(crate) async fn release(&self, within: Duration) -> Result<(), LostReason> {
        let release = async {
            match self {
                Grant::Lock(g) => g.release().await,
                Grant::Leader(l) => l.resign().await,
            }
        };
        match tokio::time::timeout(within, release).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(Error::NotHeld(reason))) => Err(reason),
            Ok(Err(e)) => {
                say!(
                    "releasing the {}: {}",
                    self.what(),
                    crate::message::describe(&e)
                );
                Ok(())
            }
            Err(_) => {
                say!("releasing the {}: no answer within {within:?}", self.what());
                Ok(())
            }
        }
    }
}
