//! Behind Sentinel, a grant that an entry's expiry decides asks the sentinels first.
//!
//! `SENTINEL FAILOVER` leaves the old primary taking writes until the sentinels reconfigure it,
//! seconds later. Sessions that found the new primary renew their keys there, so on the old
//! one their entries expire, and a session still on the old primary would be granted what
//! their owners hold on the new one (black-box round 22). A grant that an owner's release
//! decides pays nothing for this: the owner was on this primary when it released. A grant that
//! an expiry decides asks: a wait that reached the deadline of the session ahead, a message
//! that the entry ahead was dropped as expired and ours heads the queue (`NAME TOKEN
//! expired`, `gone NAME TOKEN expired`, from whichever session's script dropped it), and a
//! read of the queue (an enqueue, a re-read, a wait's check) within seconds of such a drop in
//! that queue (the scripts mark the queue, see `drop` in `scripts/prelude.lua`). If the primary
//! moved since the reply or message came, or the sentinels now name another one, the operation
//! fails with a temporary error, and the core retries it there.
//!
//! Every client of the servers must be of a version that marks its drops so: an older one's
//! drop of an expired entry says `head`, and its waiter is granted without asking.

use fencelock::{Error, Result};

use crate::lifecycle::RedisSession;

/// `Ok` unless `expired`, behind Sentinel, and the primary is not the one of generation
/// `seen` (the one the reply or message came from) or the sentinels now name another one:
/// then a temporary error of operation `op` (the session moved to that primary). Sentinels
/// that do not answer change nothing.
pub(crate) async fn unless_moved(
    session: &RedisSession,
    expired: bool,
    seen: u64,
    op: &'static str,
) -> Result<()> {
    let primary = &session.primary;
    if !expired || !primary.behind_sentinel() {
        return Ok(());
    }
    if primary.generation() != seen || primary.moved_now().await {
        return Err(Error::backend(
            crate::error::NAME,
            op,
            true,
            "the primary moved (Sentinel): an entry ahead expired on the old one",
        ));
    }
    Ok(())
}

/// The scripts' argument that has them report whether the queue had an entry dropped as
/// expired lately: asked behind Sentinel only.
pub(crate) fn ask_recent(session: &RedisSession) -> &'static str {
    if session.primary.behind_sentinel() {
        "1"
    } else {
        "0"
    }
}
