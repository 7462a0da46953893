//! The reads of a Redis session: a queue's head and waiting until it changes, a queue's
//! entries with their values, and every key of a namespace.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use fencelock::backend::{Entry, EntryInfo, QueueId};
use fencelock::{FencingToken, Result};

use crate::cluster;
use crate::error::unexpected;
use crate::layout::{chan_head, entries_glob, kind_of, queue_path, Group, Groups};
use crate::lifecycle::{RedisSession, EXPIRY_SLACK};
use crate::reply::{args, array, bytes, int, text};
use crate::scripts;

/// How many entry names one `LIVE` check takes.
const LIST_CHUNK: usize = 1000;

pub(crate) async fn head(
    session: &RedisSession,
    queue: &QueueId,
) -> Result<Option<(Entry, Vec<u8>)>> {
    Ok(session.head_with_ttl(queue).await?.map(|(head, _)| head))
}

pub(crate) async fn wait_queue_change(
    session: &RedisSession,
    queue: &QueueId,
    seen: Option<&(Entry, Vec<u8>)>,
) -> Result<()> {
    let reg = session.notifier.register(chan_head(queue)).await?;
    let now = session.head_with_ttl(queue).await?;
    if now.as_ref().map(|(h, _)| h) != seen {
        return Ok(());
    }
    match now {
        // The head's session expires without a message: look again when it would.
        Some((_, left)) => tokio::select! {
            r = reg.notified() => r.map(drop),
            _ = tokio::time::sleep(left + EXPIRY_SLACK) => Ok(()),
        },
        // Empty: an enqueue announces its entry; read again at the latest after
        // `recheck_every` all the same (a message lost on a cluster's bus).
        None => {
            match tokio::time::timeout(fencelock_net::recheck_every(session.ttl), reg.notified())
                .await
            {
                Ok(r) => r.map(drop),
                Err(_) => Ok(()),
            }
        }
    }
}

pub(crate) async fn inspect(session: &RedisSession, queue: &QueueId) -> Result<Vec<EntryInfo>> {
    let reply = session
        .call(
            "inspect",
            &scripts::INSPECT,
            &session.groups.of_queue(queue),
            args![queue_path(queue)],
        )
        .await?;
    let rows = array(&reply).ok_or_else(|| unexpected("inspect"))?;
    rows.iter()
        .map(|row| {
            let r = array(row)?;
            let created = r
                .get(4)
                .and_then(int)
                .and_then(|ms| u64::try_from(ms).ok())
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
            Some(EntryInfo::new(
                text(r.first()?)?,
                FencingToken::new(u64::try_from(int(r.get(1)?)?).ok()?),
                kind_of(&text(r.get(2)?)?),
                text(r.get(3)?)?,
                r.get(5).map(bytes).unwrap_or_default(),
                created,
            ))
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| unexpected("inspect"))
}

pub(crate) async fn list(session: &RedisSession, namespace: &str) -> Result<Vec<String>> {
    let mut con = session.primary.con();
    let glob = entries_glob(session.groups, namespace);
    // On a cluster, every primary holds some groups' keys.
    let nodes = match session.groups {
        Groups::Single => vec![0],
        Groups::Cluster => cluster::primaries(&mut con)
            .await
            .map_err(|e| session.primary.failed("list", e))?,
    };
    let mut names = Vec::new();
    for node in &nodes {
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&glob)
                .arg("COUNT")
                .arg(1000);
            // Raw bytes: a foreign key that is not UTF-8 under our prefix is skipped, rather
            // than failing the whole listing (fencelock's own names are UTF-8).
            let (next, keys): (u64, Vec<Vec<u8>>) =
                cluster::on_node(&mut con, *node, scan)
                    .await
                    .map_err(|e| session.primary.failed("list", e))?;
            names.extend(keys.into_iter().filter_map(|k| {
                let k = String::from_utf8(k).ok()?;
                // `fencelock:e:{name}`, or `fencelock{G}:e:{name}` on a cluster.
                let (_, name) = k.split_once(":e:")?;
                Some(name.to_string())
            }));
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    // Checked group by group (each group's keys are on one node).
    let mut by_group: BTreeMap<Group, Vec<String>> = BTreeMap::new();
    for name in names {
        if let Some(g) = session.groups.of_entry(&name) {
            by_group.entry(g).or_default().push(name);
        }
    }
    let mut live = Vec::new();
    for (group, names) in &by_group {
        for chunk in names.chunks(LIST_CHUNK) {
            let reply = session
                .call("list", &scripts::LIVE, group, chunk.iter().collect())
                .await?;
            let a = array(&reply).ok_or_else(|| unexpected("list"))?;
            live.extend(a.iter().filter_map(text));
        }
    }
    live.sort();
    live.dedup();
    Ok(live)
}
