//! Watching a granted entry for its end: its deletion (by the scripts, which publish it, or
//! outside them), or, behind Sentinel, a failover that left others ahead of it.

use fencelock::backend::{Entry, EntryKind, QueueId};
use fencelock::{Error, LostReason, Result};

use crate::layout::chan_entry;
use crate::lifecycle::RedisSession;
use crate::queue::still_ahead;

/// Waits for `own` to go (see [`watch`]).
pub(crate) async fn wait_own_gone(session: &RedisSession, own: &Entry) -> Result<()> {
    watch(session, own, None).await.map(|_| ())
}

/// Waits for `own`'s grant to end, by the rule that looks at `nearest` entries (of `kind`)
/// ahead of it (see [`watch`]).
pub(crate) async fn wait_grant_lost(
    session: &RedisSession,
    own: &Entry,
    queue: &QueueId,
    kind: Option<EntryKind>,
    nearest: usize,
) -> Result<LostReason> {
    watch(session, own, Some((queue, kind, nearest))).await
}

/// Waits for `own` to go: woken by the scripts that delete entries (on its channel), and
/// reading it again every [`fencelock_net::recheck_every`] at most, since a deletion outside
/// them publishes nothing: a `DEL` by an operator, an eviction under a `maxmemory` policy, a
/// queue's key deleted. (Without the reads, such a loss went unnoticed until the entry's
/// release: the `fencelock` command ran on beside the next holder.)
///
/// With a `grant` (its queue and its rule's window), also ends when the primary has moved
/// (Sentinel) and the new one has as many entries ahead of `own` as the rule allows no grant
/// with. A primary demoted by `SENTINEL FAILOVER` takes writes until the sentinels reconfigure
/// it, seconds later: a session that heartbeats seldom (a long TTL) stays there, sees the
/// sessions that moved on expire, and is granted; once it moves too, its key and entry are on
/// the new primary, behind theirs (black-box round 22: two `fencelock` commands ran side by
/// side for 45 s). So the first look, and each after a move, reads what is ahead; and each
/// look has the sentinels asked whether the primary moved (at most once a second).
async fn watch(
    session: &RedisSession,
    own: &Entry,
    grant: Option<(&QueueId, Option<EntryKind>, usize)>,
) -> Result<LostReason> {
    let reg = session.notifier.register(chan_entry(&own.key)).await?;
    let every = fencelock_net::recheck_every(session.ttl);
    // Generation 0 is the session's first primary: a grant made there needs no re-check.
    let mut checked = 0;
    loop {
        if session.read_own(own, false).await?.is_none() {
            // Gone from a primary that a failover put in place since the last look: a replica
            // that never got the entry (a lagging one), not someone's delete.
            let moved = grant.is_some() && session.primary.generation() != checked;
            return Ok(if moved {
                LostReason::Superseded
            } else {
                LostReason::EntryDeleted
            });
        }
        if let Some((queue, kind, nearest)) = grant {
            let generation = session.primary.generation();
            if generation != checked {
                match still_ahead(session, own, queue, kind, nearest).await {
                    Ok(ahead) if ahead.len() >= nearest => return Ok(LostReason::Superseded),
                    Ok(_) => checked = generation,
                    Err(Error::EntryVanished { .. }) => return Ok(LostReason::EntryDeleted),
                    Err(e) if e.is_temporary() => return Err(e),
                    // Not looked at again (its deletion still is): a permanent error here
                    // would end the watch, and with it what the reads of `own` tell.
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot read what is ahead after a move");
                        checked = generation;
                    }
                }
            }
            session.primary.check();
        }
        if let Ok(notified) = tokio::time::timeout(every, reg.notified()).await {
            notified?;
        }
    }
}
