//! The queue operations of a Redis session: enqueue (one queue or several at once), wait for
//! the entries ahead, re-read them, remove or abandon an entry, set its value.

use std::collections::BTreeMap;

use fencelock::backend::{
    key_value_entry_key, EnqueueRequest, Enqueued, Entry, EntryKind, Peer, QueueId,
};
use fencelock::{Error, LostReason, Result, SessionEnd};
use uuid::Uuid;

use crate::error::unexpected;
use crate::expired::{ask_recent, dropped_at, unless_moved};
use crate::layout::{filter_code, kind_code, queue_path, Group};
use crate::lifecycle::{check_value, RedisSession};
use crate::reply::{args, array, entry, int, int_line, lines, ms, peer_lines, peers};
use crate::scripts;

mod wait;
pub(crate) use wait::wait;

/// The time an entry is created at, as inspection shows it: this client's clock, in ms since
/// the epoch (the server's `TIME` cost a script as much as any two of its other steps).
fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

pub(crate) async fn enqueue(session: &RedisSession, req: EnqueueRequest<'_>) -> Result<Enqueued> {
    check_value(req.value)?;
    let name = key_value_entry_key(req.queue, &session.sid, req.kind, req.attempt);
    let group = session.groups.of_queue(req.queue);
    let changing = session.gate.read().await;
    // Tracked with its group counted in, at once: a heartbeat in between would let the
    // group go while this create makes the session's key there.
    // Counted once per attempt: a retry may find what the first try created.
    let (entering, diverged, sent) = {
        let mut o = session.owned();
        if !req.retry {
            o.track(&name);
        }
        let (entering, diverged) = o.entering(&group);
        (entering, diverged, o.handled())
    };
    let args = args![
        &session.sid,
        queue_path(req.queue),
        &name,
        kind_code(req.kind),
        req.value,
        ms(session.ttl),
        filter_code(req.ahead.kind),
        req.ahead.nearest,
        session.known(&group),
        if entering { "1" } else { "0" },
        now_ms(),
        ask_recent(session),
        if diverged { "1" } else { "0" },
    ];
    // Before it is sent: a deletion after the create is published there from then on.
    let generation = session.primary.generation();
    let epoch = session.own_channel.epoch(generation);
    let reply = match session
        .create_call("enqueue", &scripts::ENQUEUE, &group, args)
        .await
    {
        Ok(reply) => reply,
        Err(e) => {
            // A temporary error may hide a create: the core abandons the attempt.
            if !e.is_temporary() {
                session.owned().untrack(&name);
            }
            return Err(e);
        }
    };
    let mut l = lines(&reply).ok_or_else(|| unexpected("enqueue"))?;
    let token = int_line(l.next()).ok_or_else(|| unexpected("enqueue"))?;
    if token < 0 {
        return Err(Error::SessionLost(SessionEnd::Expired));
    }
    let (version, behind) = (int_line(l.next()), int_line(l.next()));
    let wait = int_line(l.next());
    let dropped = dropped_at(int_line(l.next()));
    let ahead = peer_lines(l).ok_or_else(|| unexpected("enqueue"))?;
    {
        let mut o = session.owned();
        o.created(&name, version);
        o.saw(&group, version, behind, sent);
    }
    drop(changing);
    // If it grants (a temporary error: the core abandons the attempt, on the new primary).
    let grants = ahead.len() < req.ahead.nearest;
    unless_moved(session, dropped.filter(|_| grants), generation, "enqueue").await?;
    let own = entry(name, req.kind, token as u64);
    if !ahead.is_empty() {
        session.own_channel.record(&own, epoch, wait);
    }
    Ok(Enqueued::new(own, ahead))
}

pub(crate) async fn enqueue_all(
    session: &RedisSession,
    reqs: &[EnqueueRequest<'_>],
) -> Result<Option<Vec<Entry>>> {
    // One script per group, in the groups' order (one on a server; on a cluster, one if every
    // queue is in one group). A set in several groups is taken group by group, and what was
    // taken is released again if a later group is taken (others may see those entries
    // meanwhile, as on ZooKeeper); an error leaves the undoing to the core, which abandons
    // every queue of the attempt.
    let mut by_group: BTreeMap<Group, Vec<usize>> = BTreeMap::new();
    for (i, r) in reqs.iter().enumerate() {
        by_group
            .entry(session.groups.of_queue(r.queue))
            .or_default()
            .push(i);
    }
    let mut entries: Vec<Option<Entry>> = vec![None; reqs.len()];
    for (group, idx) in &by_group {
        let part: Vec<EnqueueRequest<'_>> = idx.iter().map(|&i| reqs[i]).collect();
        match enqueue_group(session, group, &part).await? {
            Some(got) => {
                for (&i, e) in idx.iter().zip(got) {
                    entries[i] = Some(e);
                }
            }
            None => {
                let taken: Vec<&Entry> = entries.iter().flatten().collect();
                let undo = taken.iter().map(|e| remove(session, e));
                for r in futures_util::future::join_all(undo).await {
                    match r {
                        // Gone, and why is known (see `remove`): nothing to take back.
                        Ok(_) | Err(Error::NotHeld(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                return Ok(None);
            }
        }
    }
    Ok(entries.into_iter().collect())
}

/// `enqueue_all` of queues that are all in `group`: one script.
async fn enqueue_group(
    session: &RedisSession,
    group: &Group,
    reqs: &[EnqueueRequest<'_>],
) -> Result<Option<Vec<Entry>>> {
    let Some(first) = reqs.first() else {
        return Ok(Some(Vec::new()));
    };
    let changing = session.gate.read().await;
    let names: Vec<String> = reqs
        .iter()
        .map(|r| key_value_entry_key(r.queue, &session.sid, r.kind, r.attempt))
        .collect();
    // As in `enqueue`: tracked with the group counted in, at once.
    let (entering, diverged, sent) = {
        let mut o = session.owned();
        if !first.retry {
            for name in &names {
                o.track(name);
            }
        }
        let (entering, diverged) = o.entering(group);
        (entering, diverged, o.handled())
    };
    let mut args = args![
        &session.sid,
        ms(session.ttl),
        session.known(group),
        if entering { "1" } else { "0" },
        now_ms(),
        ask_recent(session),
        if diverged { "1" } else { "0" },
    ];
    for (r, name) in reqs.iter().zip(&names) {
        args.push(queue_path(r.queue))
            .push(name)
            .push(kind_code(r.kind))
            .push(r.value);
    }
    let untrack = |names: &[String]| {
        let mut o = session.owned();
        for name in names {
            o.untrack(name);
        }
    };
    let generation = session.primary.generation();
    let reply = match session
        .create_call("enqueue all", &scripts::ENQUEUE_ALL, group, args)
        .await
    {
        Ok(reply) => reply,
        Err(e) => {
            if !e.is_temporary() {
                untrack(&names);
            }
            return Err(e);
        }
    };
    let a = array(&reply).ok_or_else(|| unexpected("enqueue all"))?;
    match a.first().and_then(int) {
        Some(-1) => Err(Error::SessionLost(SessionEnd::Expired)),
        Some(0) => {
            untrack(&names);
            Ok(None)
        }
        Some(1) => {
            {
                let version = a.get(2).and_then(int);
                let mut o = session.owned();
                for name in &names {
                    o.created(name, version);
                }
                o.saw(group, version, a.get(3).and_then(int), sent);
            }
            let tokens = a
                .get(1)
                .and_then(array)
                .ok_or_else(|| unexpected("enqueue all"))?;
            let entries = names
                .into_iter()
                .zip(reqs)
                .zip(tokens)
                .map(|((name, r), t)| {
                    let t = int(t).and_then(|t| u64::try_from(t).ok());
                    t.map(|t| entry(name, r.kind, t))
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| unexpected("enqueue all"))?;
            drop(changing);
            let dropped = dropped_at(a.get(4).and_then(int));
            unless_moved(session, dropped, generation, "enqueue all").await?;
            Ok(Some(entries))
        }
        _ => Err(unexpected("enqueue all")),
    }
}

pub(crate) async fn still_ahead(
    session: &RedisSession,
    own: &Entry,
    queue: &QueueId,
    kind: Option<EntryKind>,
    nearest: usize,
) -> Result<Vec<Peer>> {
    // Found at the head, live, by the release that ended the wait before this call: nothing
    // is ahead of it, of any kind (an entry created later goes behind).
    if session.took_head(own) {
        return Ok(Vec::new());
    }
    let generation = session.primary.generation();
    let epoch = session.own_channel.epoch(generation);
    let reply = session
        .call(
            "read queue",
            &scripts::STILL_AHEAD,
            &session.groups.of_queue(queue),
            args![
                queue_path(queue),
                &own.key,
                own.token.get(),
                filter_code(kind),
                nearest,
                ask_recent(session),
            ],
        )
        .await?;
    let a = array(&reply).ok_or_else(|| unexpected("read queue"))?;
    match a.first().and_then(int) {
        Some(0) => Err(RedisSession::vanished(own)),
        Some(1) => {
            let ahead = a
                .get(1)
                .and_then(peers)
                .ok_or_else(|| unexpected("read queue"))?;
            if !ahead.is_empty() {
                session
                    .own_channel
                    .record(own, epoch, a.get(2).and_then(int));
            }
            // If it grants: fewer than `nearest` ahead (see `Rule::window` in the core).
            let dropped = dropped_at(a.get(3).and_then(int)).filter(|_| ahead.len() < nearest);
            unless_moved(session, dropped, generation, "read queue").await?;
            Ok(ahead)
        }
        _ => Err(unexpected("read queue")),
    }
}

/// Deletes `entry` (see [`fencelock::backend::BackendSession::remove`]). Behind Sentinel, fails
/// with [`Error::NotHeld`]`(`[`LostReason::Superseded`]`)`, as `lost()` ends (see `held::watch`),
/// when a failover to a replica that lagged lost its create: a server found behind the
/// version that create made (by this reply or an earlier one: a heartbeat's, which then
/// reconciles the version). Not `EntryDeleted`, which blames someone's delete. (Found gone
/// after a failover that kept the create, it was deleted by someone, or by a try of this
/// release whose reply was lost: said as before.)
pub(crate) async fn remove(session: &RedisSession, entry: &Entry) -> Result<bool> {
    // A wait cancelled after it learnt its entry headed the queue leaves that behind.
    session.took_head(entry);
    session
        .own_channel
        .forget(&entry.key, Some(entry.token.get()));
    let group = session.entry_group(&entry.key)?;
    let _changing = session.gate.read().await;
    let (known, sent) = {
        let o = session.owned();
        (o.known(&group), o.handled())
    };
    let reply = session
        .call(
            "release",
            &scripts::REMOVE,
            &group,
            args![&entry.key, entry.token.get(), known],
        )
        .await?;
    let mut l = lines(&reply).ok_or_else(|| unexpected("release"))?;
    let removed = int_line(l.next()) == Some(1);
    let (version, behind) = (int_line(l.next()), int_line(l.next()));
    let lost = {
        let mut o = session.owned();
        o.saw(&group, version.filter(|v| *v >= 0), behind, sent);
        let lost = o.lost(&entry.key);
        o.untrack(&entry.key);
        lost
    };
    if !removed && lost && session.primary.behind_sentinel() {
        return Err(Error::NotHeld(LostReason::Superseded));
    }
    Ok(removed)
}

pub(crate) async fn abandon(
    session: &RedisSession,
    queue: &QueueId,
    kind: EntryKind,
    attempt: Uuid,
) -> Result<()> {
    let name = key_value_entry_key(queue, &session.sid, kind, attempt);
    // Whatever token the attempt's entry had (the core abandons attempts whose entry it does
    // not know, which never waited: a backstop).
    session.forget_head(&name);
    session.own_channel.forget(&name, None);
    let group = session.groups.of_queue(queue);
    let _changing = session.gate.read().await;
    let (known, sent) = {
        let o = session.owned();
        (o.known(&group), o.handled())
    };
    let reply = session
        .call(
            "abandon",
            &scripts::ABANDON,
            &group,
            args![queue_path(queue), &name, &session.sid, known],
        )
        .await?;
    let a = array(&reply).ok_or_else(|| unexpected("abandon"))?;
    let mut o = session.owned();
    o.untrack(&name);
    o.saw(
        &group,
        a.first().and_then(int).filter(|v| *v >= 0),
        a.get(1).and_then(int),
        sent,
    );
    Ok(())
}

pub(crate) async fn set_value(session: &RedisSession, entry: &Entry, value: &[u8]) -> Result<bool> {
    check_value(value)?;
    let reply = session
        .call(
            "proclaim",
            &scripts::SET_VALUE,
            &session.entry_group(&entry.key)?,
            args![&entry.key, entry.token.get(), value],
        )
        .await?;
    Ok(int(&reply) == Some(1))
}
