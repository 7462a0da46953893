//! Behind Sentinel, a grant that an entry's expiry decides asks the sentinels first.
//!
//! `SENTINEL FAILOVER` leaves the old primary taking writes until the sentinels reconfigure it,
//! seconds later. Sessions that found the new primary renew their keys there, so on the old
//! one their entries expire, and a session still on the old primary would be granted what
//! their owners hold on the new one (black-box round 22). A grant that an owner's release
//! decides pays nothing for this: the owner was on this primary when it released. A grant that
//! an expiry may have decided asks: a message that the entry ahead was dropped as expired and
//! ours heads the queue (`NAME TOKEN expired`, `gone NAME TOKEN expired`, from whichever
//! session's script dropped it), and a read of the queue that grants (an enqueue, a re-read)
//! within [`RECENT`] of such a drop in that queue (the scripts mark the queue, see `drop` in
//! `scripts/prelude.lua`). If the primary moved since the reply or message came, or the
//! sentinels, asked after the drop, name another primary that answers as one, the operation
//! fails with a temporary error, and the core retries it there. One question, started after
//! the drop, serves every grant that follows it; sentinels that do not answer within
//! [`ASK_WITHIN`] change nothing.
//!
//! Every client of the servers must be of a version that marks its drops so: an older one's
//! drop of an expired entry says `head`, and its waiter is granted without asking (and an
//! older waiter does not understand `expired`: it reads the queue at its predecessor's
//! deadline).

use std::time::{Duration, Instant};

use fencelock::{Error, Result};

use crate::lifecycle::RedisSession;

/// How long a queue stays marked after an entry of it was dropped as expired (`RECENT` in
/// `scripts/prelude.lua`).
pub(crate) const RECENT: Duration = Duration::from_secs(10);

/// How long a grant waits for the sentinels' answer (the configured timeout, if less).
pub(crate) const ASK_WITHIN: Duration = Duration::from_secs(1);

/// `Ok` unless an entry ahead expired (`since`: when, at the latest), behind Sentinel, and the
/// primary is not the one of generation `seen` (the one the reply or message came from), or
/// the sentinels, asked after `since`, name another one: then a temporary error of operation
/// `op` (the session moved to that primary).
pub(crate) async fn unless_moved(
    session: &RedisSession,
    since: Option<Instant>,
    seen: u64,
    op: &'static str,
) -> Result<()> {
    let primary = &session.primary;
    let Some(since) = since.filter(|_| primary.behind_sentinel()) else {
        return Ok(());
    };
    let within = ASK_WITHIN.min(primary.timeout());
    let moved = primary.generation() != seen
        || tokio::time::timeout(within, primary.moved_now(since))
            .await
            .unwrap_or(false);
    if moved {
        return Err(Error::backend(
            crate::error::NAME,
            op,
            true,
            "the primary moved (Sentinel): an entry ahead expired on the old one",
        ));
    }
    Ok(())
}

/// When the drop that marked a queue happened, at the latest, from the ms its mark had left
/// (`-1`: no mark, or not asked).
pub(crate) fn dropped_at(left_ms: Option<i64>) -> Option<Instant> {
    let left = Duration::from_millis(u64::try_from(left_ms?).ok()?);
    Some(
        Instant::now()
            .checked_sub(RECENT.saturating_sub(left))
            .unwrap_or_else(Instant::now),
    )
}

/// The scripts' argument that has them report the queue's mark: asked behind Sentinel only.
pub(crate) fn ask_recent(session: &RedisSession) -> &'static str {
    if session.primary.behind_sentinel() {
        "1"
    } else {
        "0"
    }
}
