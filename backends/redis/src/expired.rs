//! Behind Sentinel, a grant that an entry's expiry decides asks the sentinels first.
//!
//! `SENTINEL FAILOVER` leaves the old primary taking writes until the sentinels reconfigure it,
//! seconds later. Sessions that found the new primary renew their keys there, so on the old
//! one their entries expire, and a session still on the old primary would be granted what
//! their owners hold on the new one (black-box round 22). A grant that an owner's release
//! decides pays nothing for this: the owner was on this primary when it released. A grant that
//! an expiry decides asks: the wait's target found expired (at its session's deadline, or
//! dropped by the wait's check), a dead entry dropped by the enqueue or the read that decides
//! the grant, or a message saying that the entry ahead was dropped as expired (by any
//! session's script: `NAME TOKEN expired`, `gone NAME TOKEN expired`). If the sentinels name
//! another primary, the operation fails with a temporary error, and the core retries it there.

use fencelock::{Error, Result};

use crate::lifecycle::RedisSession;

/// `Ok` unless `expired` and, behind Sentinel, the sentinels now name another primary (then a
/// temporary error of operation `op`, the session moved to that primary). Sentinels that do
/// not answer change nothing.
pub(crate) async fn unless_moved(
    session: &RedisSession,
    expired: bool,
    op: &'static str,
) -> Result<()> {
    if expired && session.primary.moved_now().await {
        return Err(Error::backend(
            crate::error::NAME,
            op,
            true,
            "the primary moved (Sentinel): an entry ahead expired on the old one",
        ));
    }
    Ok(())
}
