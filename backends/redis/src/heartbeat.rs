//! A Redis session's heartbeat: one script per group the session has a key in, which renews
//! the key, tells the client of changes the server lost (a failover to a replica that
//! lagged), and, behind Sentinel, gives way when the primary moves while it waits.

use std::time::{Duration, Instant};

use fencelock::{Error, Result, SessionEnd};

use crate::error::{unexpected, NAME};
use crate::layout::{Group, Groups};
use crate::lifecycle::RedisSession;
use crate::reply::{args, array, int, ms, text};
use crate::scripts;

/// Renews the session (see the module's documentation).
pub(crate) async fn keep_alive(session: &RedisSession) -> Result<()> {
    if !session.primary.behind_sentinel() {
        return beat(session).await;
    }
    // The sentinels asked before the beat (at most every `CHECK_EVERY`, for a moment at most:
    // hung sentinels hold no heartbeat), so that a move found now is followed by this beat.
    // Asked in the background, the beat went to the demoted primary, and the session's key
    // was renewed on the new one only at the next beat, a third of the TTL later: after
    // `SENTINEL FAILOVER`, sessions of a 5 s TTL expired there (black-box round 22).
    if session.primary.check_due() {
        // A tenth of the TTL at most: the core gives a heartbeat a third.
        let patience = CHECK_PATIENCE.min(session.ttl / 10);
        let asked = tokio::time::timeout(
            patience,
            session.primary.moved_now(std::time::Instant::now()),
        )
        .await;
        if asked.is_err() {
            session.primary.suspect();
        }
    }
    // A primary that hangs (paused, its host suspended) answers nothing, and so nothing has
    // the sentinels asked: each heartbeat waited out the core's patience (a third of the
    // TTL), its retry went to the same primary, and a session was lost at a TTL of 10 s
    // though the sentinels had named another primary 4 s after the pause (a killed primary,
    // whose refusals ask them at once, cost nothing). While a heartbeat waits, the sentinels
    // are asked again (at most every `CHECK_EVERY`); once the primary has moved, the heartbeat
    // gives way, to be retried on the new one after the core's short pause.
    let generation = session.primary.generation();
    let mut beat = std::pin::pin!(beat(session));
    loop {
        tokio::select! {
            // An answer that came is taken, whatever moved meanwhile.
            biased;
            done = &mut beat => return done,
            () = tokio::time::sleep(MOVE_POLL) => {
                if session.primary.generation() != generation {
                    return Err(Error::backend(
                        NAME,
                        "keep-alive",
                        true,
                        "the primary moved (Sentinel) while the heartbeat waited",
                    ));
                }
                session.primary.check();
            }
        }
    }
}

/// A heartbeat of a Redis Cluster group whose slot is half moved: its script, which meets keys
/// on both nodes, stops with `TRYAGAIN` until the move ends — seconds if the slot holds many
/// keys (`redis-cli --cluster reshard` moves them in batches), and a session beyond its
/// deadline was lost with its locks on every shard (black-box round 35, at 2 s half moved and
/// a TTL of 4 s). The session's key alone is renewed then, by a command the cluster client
/// sends on to the node that has it (`ASK`); its entries need no renewal at each beat (they
/// live 60 TTLs past their last: see `KEEP_ALIVE`). Whether the server lost changes is not
/// learnt at this beat (false).
///
/// For [`ALONE_FOR`] TTLs at most since the last script there: past it, a slot stuck half
/// moved (a reshard interrupted, until `redis-cli --cluster fix`) would let the entries expire
/// under a live session, and another session be granted their locks; the session is lost by
/// its deadline instead.
async fn renew_key_alone(session: &RedisSession, group: &Group, confirmed: bool) -> Result<bool> {
    let mut con = session.primary.con();
    let mut pexpire = redis::cmd("PEXPIRE");
    pexpire
        .arg(group.session_key(&session.sid))
        .arg(ms(session.ttl).to_string());
    let renewed = tokio::time::timeout(
        session.primary.timeout(),
        pexpire.query_async::<i64>(&mut con),
    )
    .await;
    match renewed {
        Ok(Ok(1)) => Ok(false),
        // Not there (yet: the enqueue that makes it is in flight).
        Ok(Ok(_)) if !confirmed => Ok(false),
        Ok(Ok(_)) => Err(Error::SessionLost(SessionEnd::Expired)),
        Ok(Err(e)) => Err(session.primary.failed("keep-alive", e)),
        Err(_) => Err(Error::backend(
            NAME,
            "keep-alive",
            true,
            "no answer within the timeout",
        )),
    }
}

/// How many TTLs past a group's last heartbeat script its session's key may be renewed alone:
/// half of the 60 its entries live past their renewal, which the cycle of slices before that
/// script may have left up to 20 beats (each at most a TTL) behind.
const ALONE_FOR: u32 = 30;

/// Whether a heartbeat may renew the session's key alone in a group whose script last ran at
/// `scripted_at` (see [`renew_key_alone`]); before the first, counted from the first beat
/// that renews it alone (the group's entries were made since the session's last beat).
fn alone_allowed(session: &RedisSession, scripted_at: Option<Instant>) -> bool {
    scripted_at.is_none_or(|at| at.elapsed() < session.ttl * ALONE_FOR)
}

/// How long a heartbeat waits for the sentinels before it beats (see [`keep_alive`]); past it,
/// they are asked in the background.
const CHECK_PATIENCE: Duration = Duration::from_millis(300);

/// The longest a heartbeat waits for the changes in flight to end before it reconciles a
/// group whose server lost changes (at most a twentieth of the TTL).
const RECONCILE_PATIENCE: Duration = Duration::from_millis(100);

/// How often a waiting heartbeat looks whether the primary moved (see [`keep_alive`]).
const MOVE_POLL: Duration = Duration::from_millis(100);

/// What a heartbeat takes of a group: the group, whether the session's key there is
/// confirmed, the version known there, where its renewal goes on, when its script last ran.
type GroupBeat = (Group, bool, i64, u64, Option<Instant>);

/// One heartbeat (see [`keep_alive`]).
async fn beat(session: &RedisSession) -> Result<()> {
    // One script per group the session has a key in (one on a server; on a cluster at most
    // GROUPS, whatever the number of locks), all at once. On a cluster, the groups where it
    // holds nothing any more are let go (their keys expire); with none left, the session owns
    // nothing on the cluster that could expire, and nothing is sent: a session that depends
    // on no shard is not lost to one that hangs (its `PING` to a primary at random, held up by
    // a hung one, lost idle sessions at TTLs up to 6 s; the cluster client holds requests
    // back while it reconnects to that node).
    let (groups, sent): (Vec<GroupBeat>, u64) = {
        let mut o = session.owned();
        if session.groups == Groups::Cluster {
            o.forget_unused(|name| session.groups.of_entry(name));
        }
        let groups = o
            .groups
            .iter()
            .map(|(g, s)| {
                (
                    g.clone(),
                    s.confirmed,
                    s.version,
                    s.renewed_to,
                    s.scripted_at,
                )
            })
            .collect();
        (groups, o.handled())
    };
    if groups.is_empty() {
        return match session.groups {
            Groups::Cluster => Ok(()),
            Groups::Single => session.ping().await,
        };
    }
    let beats = groups.iter().map(
        |(group, confirmed, known, cursor, scripted_at)| async move {
            let reply = session
                .heartbeat_call(
                    &scripts::KEEP_ALIVE,
                    group,
                    args![
                        &session.sid,
                        ms(session.ttl),
                        *known,
                        if *confirmed { "1" } else { "0" },
                        *cursor,
                    ],
                )
                .await;
            let reply = match reply {
                Ok(reply) => reply,
                Err(e)
                    if session.groups == Groups::Cluster
                        && crate::error::slot_moving(&e)
                        && alone_allowed(session, *scripted_at) =>
                {
                    if scripted_at.is_none() {
                        // The group's first beat: its entries were made since the last one.
                        if let Some(g) = session.owned().groups.get_mut(group) {
                            g.scripted_at.get_or_insert_with(Instant::now);
                        }
                    }
                    return renew_key_alone(session, group, *confirmed).await;
                }
                Err(e) => return Err(e),
            };
            let a = array(&reply).ok_or_else(|| unexpected("keep-alive"))?;
            match a.first().and_then(int) {
                Some(v) if v >= 0 => {}
                // Not made yet: the enqueue that makes it is in flight.
                Some(-2) => return Ok(false),
                Some(_) => return Err(Error::SessionLost(SessionEnd::Expired)),
                None => return Err(unexpected("keep-alive")),
            }
            let mut o = session.owned();
            o.saw(group, a.first().and_then(int), a.get(1).and_then(int), sent);
            // Where this beat's renewal of the entries' expiries stopped (the cursor can pass
            // `i64::MAX`: read as unsigned); from the start again if it cannot be read.
            let cursor = a.get(2).and_then(text).and_then(|c| c.parse().ok());
            if let Some(g) = o.groups.get_mut(group) {
                g.renewed_to = cursor.unwrap_or(0);
                g.scripted_at = Some(Instant::now());
            }
            Ok(o.groups.get(group).is_some_and(|g| g.diverged))
        },
    );
    let (mut diverged, mut failed) = (Vec::new(), None);
    for (beat, (group, ..)) in futures_util::future::join_all(beats)
        .await
        .into_iter()
        .zip(&groups)
    {
        match beat {
            Ok(true) => diverged.push(group),
            Ok(false) => {}
            // Gone in one group is gone: said before any other failure.
            Err(e @ Error::SessionLost(_)) => return Err(e),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    // Only when no change of what the session owns is in flight: waited for a moment at most
    // (the gate lets no new change start meanwhile), else tried at a later heartbeat. Not
    // merely tried: a session always changing something never reconciled, and its creates
    // there kept making their entries anew (review).
    if diverged.is_empty() {
        // Over, however it ended (a group let go, say): the next episode is warned of.
        session
            .reconciling
            .store(false, std::sync::atomic::Ordering::SeqCst);
    } else {
        let patience = (session.ttl / 20).min(RECONCILE_PATIENCE);
        if let Ok(_alone) = tokio::time::timeout(patience, session.gate.write()).await {
            use std::sync::atomic::Ordering;
            let first = !session.reconciling.swap(true, Ordering::SeqCst);
            if first {
                tracing::warn!(
                    session = %session.sid,
                    "the Redis server lost changes of this session (a failover to a replica \
                     that lagged): deleting the entries it released that came back"
                );
            }
            let mut all_done = true;
            for group in diverged {
                // The session is confirmed alive either way; a failed reconciliation is tried
                // again at the next heartbeat (warned of once).
                if let Err(e) = session.reconcile(group).await {
                    all_done = false;
                    if first {
                        tracing::warn!(session = %session.sid, error = %e, "reconciliation failed (tried again at each heartbeat)");
                    } else {
                        tracing::debug!(session = %session.sid, error = %e, "reconciliation failed");
                    }
                }
            }
            if all_done {
                session.reconciling.store(false, Ordering::SeqCst);
            }
        }
    }
    Ok(())
}
