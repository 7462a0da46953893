//! A wait for the entries ahead of one entry: on the session's own channel, or subscribed to
//! the entry it waits for (see [`crate::own_channel`]).

use std::time::{Duration, Instant};

use fencelock::backend::{Entry, Peer};
use fencelock::Result;

use crate::error::unexpected;
use crate::expired::unless_moved;
use crate::layout::chan_entry;
use crate::lifecycle::{RedisSession, EXPIRY_SLACK};
use crate::own_channel::inbox::Word;
use crate::reply::{args, array, int};
use crate::scripts;

pub(crate) async fn wait(session: &RedisSession, own: &Entry, target: &Peer) -> Result<()> {
    // Our entry read now and then: its heartbeat tells the wait of a hash deleted while its
    // member stays in the queue, but not of both gone (an operator's delete that took the
    // member too: the wait lasted until the session ahead would expire).
    let still_there = || async move {
        if session.read_own(own, false).await?.is_some() {
            return Ok(true);
        }
        // Gone: what its hash's delete left in the queue is dropped now, as its release
        // would (the next waiter woken), not at the session's next heartbeat. The heartbeat
        // drops it all the same if this fails.
        let _ = super::remove(session, own).await;
        Ok(false)
    };
    fencelock_net::unless_own_vanishes(
        session.ttl,
        &own.key,
        wait_for(session, own, target),
        still_there,
    )
    .await
}

async fn wait_for(session: &RedisSession, own: &Entry, target: &Peer) -> Result<()> {
    let generation = session.primary.generation();
    if let Some((reg, left)) = session.own_channel.covering(own, generation) {
        // The read that named `target` was sent while the session's own channel was heard,
        // and it has been since: the target's deletion is published there. Its session's
        // expiry is not: looked at (by the core's next read) when the read said it comes.
        let until = tokio::time::Instant::now() + left + EXPIRY_SLACK;
        // No message by then: the core's next read looks (and drops what expired, see
        // `crate::expired`).
        if let Some(word) = reg.news(&own.key, own.token.get(), until).await? {
            headed(session, own, word, generation).await?;
        }
        return Ok(());
    }
    // Heard from now on: the reads that follow this wait are covered.
    session
        .own_channel
        .ensure(&session.notifier, &session.sid, generation)
        .await?;
    // Subscribed before the read: a deletion between the two is not missed.
    let group = session.entry_group(&own.key)?;
    let reg = session.notifier.register(chan_entry(&target.key)).await?;
    // What the session's own channel says of our entry is heard here too: its heartbeat's
    // word that the entry's hash was deleted (the core's next read says it vanished), which
    // this wait, the session's first, took a TTL of the predecessor's to learn.
    let own_channel = session.own_channel.heard(generation);
    loop {
        let reply = session
            .call(
                "wait",
                &scripts::CHECK_WAIT,
                &group,
                args![&own.key, own.token.get(), &target.key, target.order,],
            )
            .await?;
        let a = array(&reply).ok_or_else(|| unexpected("wait"))?;
        let left = match (a.first().and_then(int), a.get(1).and_then(int)) {
            (Some(0), _) => return Err(RedisSession::vanished(own)),
            // Gone (dropped now if its session expired): the core's next read decides.
            (Some(1), Some(0)) => return Ok(()),
            (Some(1), Some(1)) => a.get(2).and_then(int).unwrap_or(0),
            _ => return Err(unexpected("wait")),
        };
        // The predecessor's session expires without a message: check again when it would.
        let left = u64::try_from(left).map_or(session.ttl, Duration::from_millis);
        let until = tokio::time::Instant::now() + left + EXPIRY_SLACK;
        let news = async {
            match &own_channel {
                Some(own_reg) => own_reg.news(&own.key, own.token.get(), until).await,
                None => Ok(std::future::pending().await),
            }
        };
        tokio::select! {
            // A message to our entry: at the head (granted without a read, as below), or the
            // core's next read says what it means.
            n = news => {
                if let Some(word) = n? {
                    return headed(session, own, word, generation).await;
                }
            }
            r = reg.notified() => {
                // Deleted after we subscribed: gone (a newer entry under the same name
                // would be behind ours). The core's next read confirms it, unless the
                // release named our entry, live, as the queue's new head.
                if r? {
                    if let Some((name, token, expired)) = reg.head() {
                        if name == own.key && token == own.token.get() {
                            let word = if expired { Word::Expired } else { Word::Head };
                            return headed(session, own, word, generation).await;
                        }
                    }
                    return Ok(());
                }
            }
            _ = tokio::time::sleep_until(until) => {}
        }
    }
}

/// What a message (of a wait that began on the primary of `generation`) told `own`: at the
/// head, it is granted without a read, unless the entry ahead expired and the primary moved
/// (see [`crate::expired`]).
async fn headed(session: &RedisSession, own: &Entry, word: Word, generation: u64) -> Result<()> {
    if word == Word::Ahead {
        return Ok(());
    }
    let since = (word == Word::Expired).then(Instant::now);
    unless_moved(session, since, generation, "wait").await?;
    session.headed(own);
    Ok(())
}
