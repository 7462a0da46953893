//! One Redis session: a session key with a TTL and the queue operations, each one script.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use fencelock::backend::{
    BackendSession, EnqueueRequest, Enqueued, Entry, EntryInfo, EntryKind, Peer, QueueId,
    REVOKE_MARKER,
};
use fencelock::{Error, FencingToken, Result, SessionEnd};
use redis::aio::ConnectionManager;
use redis::{Script, ScriptInvocation, Value};
use tokio::sync::RwLock;
use uuid::Uuid;

use crate::config::RedisConfig;
use crate::error::{map, unexpected};
use crate::layout::{
    chan_entry, chan_head, entries_glob, entry_name, filter_code, kind_code, kind_of, queue_path,
    KEY_PREFIX,
};
use crate::notify::Notifier;
use crate::owned::Owned;
use crate::replicas::Acks;
use crate::reply::{arg, array, bytes, entry, int, ms, peers, text, Args};
use crate::scripts;

/// How much later than the predecessor's session expiry a waiter re-checks it: Redis expires
/// a key when it is read at or after its deadline, so a little slack is enough.
const EXPIRY_SLACK: Duration = Duration::from_millis(20);

/// How many entry names one `LIVE` check takes.
const LIST_CHUNK: usize = 1000;

pub(crate) struct RedisSession {
    con: ConnectionManager,
    /// With `wait_for_replicas`: where creates and heartbeats go, each followed by a `WAIT`.
    acked: Option<Arc<Acks>>,
    sid: String,
    ttl: Duration,
    notifier: Notifier,
    owned: StdMutex<Owned>,
    /// Held, shared, by every change of what the session owns, from tracking it to its reply;
    /// a reconciliation takes it alone, so that it never deletes a create in flight.
    gate: RwLock<()>,
}

impl std::fmt::Debug for RedisSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSession")
            .field("sid", &self.sid)
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// The backstop of the contract: a value over the limit is refused before anything is sent (the
/// core checks first).
fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > fencelock::backend::DEFAULT_MAX_VALUE_LEN {
        return Err(Error::InvalidValue(fencelock::InvalidInput::new(
            format!("{} bytes", value.len()),
            "longer than the largest value accepted",
        )));
    }
    Ok(())
}

impl RedisSession {
    pub(crate) async fn open(
        con: ConnectionManager,
        client: redis::Client,
        config: Arc<RedisConfig>,
        acked: Option<Arc<Acks>>,
        ttl: Duration,
    ) -> Result<Self> {
        // A random id: a counter could hand out a live session's id again after a failover
        // lost its increments.
        let session = RedisSession {
            con,
            acked,
            sid: Uuid::new_v4().simple().to_string(),
            ttl,
            notifier: Notifier::new(client, config.timeout),
            owned: StdMutex::default(),
            gate: RwLock::new(()),
        };
        let reply = session
            .create_call(
                "open session",
                &scripts::OPEN,
                vec![arg(&session.sid), arg(ms(ttl))],
            )
            .await?;
        if int(&reply) != Some(1) {
            return Err(unexpected("open session"));
        }
        Ok(session)
    }

    fn invocation(script: &Script, args: Args) -> ScriptInvocation<'_> {
        let mut inv = script.prepare_invoke();
        for a in args {
            inv.arg(a);
        }
        inv
    }

    async fn call(&self, op: &'static str, script: &Script, args: Args) -> Result<Value> {
        let mut con = self.con.clone();
        Self::invocation(script, args)
            .invoke_async(&mut con)
            .await
            .map_err(|e| map(op, e))
    }

    /// A call that creates something a failover must not lose: acknowledged by the replicas
    /// when the backend is configured to wait for them.
    async fn create_call(&self, op: &'static str, script: &Script, args: Args) -> Result<Value> {
        match &self.acked {
            Some(acks) => acks.creates.run(op, Self::invocation(script, args)).await,
            None => self.call(op, script, args).await,
        }
    }

    /// A heartbeat: acknowledged by the replicas too when the backend waits for them, so that
    /// a promoted replica has the session's renewed expiry (the local deadline counts from the
    /// heartbeat's send time, and must not outlast what the replica knows).
    async fn heartbeat_call(&self, script: &Script, args: Args) -> Result<Value> {
        match &self.acked {
            Some(acks) => {
                acks.heartbeats
                    .run("keep-alive", Self::invocation(script, args))
                    .await
            }
            None => self.call("keep-alive", script, args).await,
        }
    }

    fn known(&self) -> i64 {
        self.owned().version
    }

    fn owned(&self) -> std::sync::MutexGuard<'_, Owned> {
        self.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After a failover lost some of this session's changes: deletes the entries the session
    /// does not believe it owns (released ones that came back) and moves the version past both.
    /// The caller holds the gate alone.
    async fn reconcile(&self) -> Result<()> {
        let (known, names) = {
            let o = self.owned();
            (o.version, o.names.keys().cloned().collect::<Vec<_>>())
        };
        let mut args = vec![arg(&self.sid), arg(known)];
        args.extend(names.iter().map(arg));
        let reply = self.call("reconcile", &scripts::RECONCILE, args).await?;
        match int(&reply) {
            Some(v) if v >= 0 => {
                let mut o = self.owned();
                o.version = o.version.max(v);
                o.diverged = false;
                Ok(())
            }
            Some(_) => Err(Error::SessionLost(SessionEnd::Expired)),
            None => Err(unexpected("reconcile")),
        }
    }

    fn vanished(own: &Entry) -> Error {
        Error::EntryVanished {
            key: own.key.clone(),
        }
    }

    /// Whether `own` is live, and its value if `value`.
    async fn read_own(&self, own: &Entry, value: bool) -> Result<Option<Vec<u8>>> {
        let reply = self
            .call(
                "read entry",
                &scripts::READ_OWN,
                vec![
                    arg(&own.key),
                    arg(own.token.get()),
                    arg(if value { "1" } else { "0" }),
                ],
            )
            .await?;
        let a = array(&reply).ok_or_else(|| unexpected("read entry"))?;
        match a.first().and_then(int) {
            Some(1) => Ok(Some(a.get(1).map(bytes).unwrap_or_default())),
            Some(0) => Ok(None),
            _ => Err(unexpected("read entry")),
        }
    }

    /// The head of `queue`, its value, and how long its session has left.
    async fn head_with_ttl(&self, queue: &QueueId) -> Result<Option<((Entry, Vec<u8>), Duration)>> {
        let reply = self
            .call("leader", &scripts::HEAD, vec![arg(queue_path(queue))])
            .await?;
        let a = array(&reply).ok_or_else(|| unexpected("leader"))?;
        if a.is_empty() {
            return Ok(None);
        }
        let parse = || -> Option<_> {
            let key = text(a.first()?)?;
            let token = u64::try_from(int(a.get(1)?)?).ok()?;
            let kind = kind_of(&text(a.get(2)?)?);
            let value = bytes(a.get(3)?);
            // No expiry at all (-1: persisted by hand): looked at again after a TTL, not
            // polled.
            let left = u64::try_from(int(a.get(4)?)?).map_or(self.ttl, Duration::from_millis);
            Some(((entry(key, kind, token), value), left))
        };
        parse().map(Some).ok_or_else(|| unexpected("leader"))
    }
}

#[async_trait]
impl BackendSession for RedisSession {
    fn id(&self) -> String {
        self.sid.clone()
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn keep_alive(&self) -> Result<()> {
        let reply = self
            .heartbeat_call(
                &scripts::KEEP_ALIVE,
                vec![arg(&self.sid), arg(ms(self.ttl)), arg(self.known())],
            )
            .await?;
        let a = array(&reply).ok_or_else(|| unexpected("keep-alive"))?;
        match a.first().and_then(int) {
            Some(v) if v >= 0 => {}
            Some(_) => return Err(Error::SessionLost(SessionEnd::Expired)),
            None => return Err(unexpected("keep-alive")),
        }
        let diverged = {
            let mut o = self.owned();
            o.saw(a.first().and_then(int), a.get(1).and_then(int));
            o.diverged
        };
        // Only when no change of what the session owns is in flight (else at a later
        // heartbeat): the heartbeat itself never waits for one.
        if diverged {
            if let Ok(_alone) = self.gate.try_write() {
                tracing::warn!(
                    session = %self.sid,
                    "the Redis server lost changes of this session (a failover to a replica \
                     that lagged): deleting the entries it released that came back"
                );
                // The session is confirmed alive either way; a failed reconciliation is tried
                // again at the next heartbeat.
                if let Err(e) = self.reconcile().await {
                    tracing::warn!(session = %self.sid, error = %e, "reconciliation failed");
                }
            }
        }
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        self.notifier.shutdown().await;
        self.call("close", &scripts::CLOSE, vec![arg(&self.sid)])
            .await?;
        Ok(())
    }

    async fn enqueue(&self, req: EnqueueRequest<'_>) -> Result<Enqueued> {
        check_value(req.value)?;
        let name = entry_name(req.queue, &self.sid, req.kind, req.attempt);
        let _changing = self.gate.read().await;
        let args = vec![
            arg(&self.sid),
            arg(queue_path(req.queue)),
            arg(&name),
            arg(kind_code(req.kind)),
            req.value.to_vec(),
            arg(ms(self.ttl)),
            arg(filter_code(req.ahead.kind)),
            arg(req.ahead.nearest),
            arg(self.known()),
        ];
        // Counted once per attempt: a retry may find what the first try created.
        if !req.retry {
            self.owned().track(&name);
        }
        let reply = match self.create_call("enqueue", &scripts::ENQUEUE, args).await {
            Ok(reply) => reply,
            Err(e) => {
                // A temporary error may hide a create: the core abandons the attempt.
                if !e.is_temporary() {
                    self.owned().untrack(&name);
                }
                return Err(e);
            }
        };
        let a = array(&reply).ok_or_else(|| unexpected("enqueue"))?;
        let token = a
            .first()
            .and_then(int)
            .ok_or_else(|| unexpected("enqueue"))?;
        if token < 0 {
            return Err(Error::SessionLost(SessionEnd::Expired));
        }
        let ahead = a
            .get(2)
            .and_then(peers)
            .ok_or_else(|| unexpected("enqueue"))?;
        self.owned()
            .saw(a.get(3).and_then(int), a.get(4).and_then(int));
        Ok(Enqueued::new(entry(name, req.kind, token as u64), ahead))
    }

    async fn enqueue_all(&self, reqs: &[EnqueueRequest<'_>]) -> Result<Option<Vec<Entry>>> {
        let Some(first) = reqs.first() else {
            return Ok(Some(Vec::new()));
        };
        let _changing = self.gate.read().await;
        let mut args = vec![arg(&self.sid), arg(ms(self.ttl)), arg(self.known())];
        let mut names = Vec::with_capacity(reqs.len());
        for r in reqs {
            let name = entry_name(r.queue, &self.sid, r.kind, r.attempt);
            args.extend([
                arg(queue_path(r.queue)),
                arg(&name),
                arg(kind_code(r.kind)),
                r.value.to_vec(),
            ]);
            names.push(name);
        }
        if !first.retry {
            for name in &names {
                self.owned().track(name);
            }
        }
        let untrack = |names: &[String]| {
            let mut o = self.owned();
            for name in names {
                o.untrack(name);
            }
        };
        let reply = match self
            .create_call("enqueue all", &scripts::ENQUEUE_ALL, args)
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
                self.owned()
                    .saw(a.get(2).and_then(int), a.get(3).and_then(int));
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
                Ok(Some(entries))
            }
            _ => Err(unexpected("enqueue all")),
        }
    }

    async fn wait(&self, own: &Entry, target: &Peer) -> Result<()> {
        // Subscribed before the read: a deletion between the two is not missed.
        let reg = self.notifier.register(chan_entry(&target.key)).await?;
        loop {
            let reply = self
                .call(
                    "wait",
                    &scripts::CHECK_WAIT,
                    vec![
                        arg(&own.key),
                        arg(own.token.get()),
                        arg(&target.key),
                        arg(target.order),
                    ],
                )
                .await?;
            let a = array(&reply).ok_or_else(|| unexpected("wait"))?;
            let left = match (a.first().and_then(int), a.get(1).and_then(int)) {
                (Some(0), _) => return Err(Self::vanished(own)),
                (Some(1), Some(0)) => return Ok(()),
                (Some(1), Some(1)) => a.get(2).and_then(int).unwrap_or(0),
                _ => return Err(unexpected("wait")),
            };
            // The predecessor's session expires without a message: check again when it would.
            let left = u64::try_from(left).map_or(self.ttl, Duration::from_millis);
            tokio::select! {
                r = reg.notified() => {
                    // Deleted after we subscribed: gone (a newer entry under the same name
                    // would be behind ours). The core's next read confirms it anyway.
                    if r? {
                        return Ok(());
                    }
                }
                _ = tokio::time::sleep(left + EXPIRY_SLACK) => {}
            }
        }
    }

    async fn exists(&self, own: &Entry) -> Result<bool> {
        Ok(self.read_own(own, false).await?.is_some())
    }

    async fn still_ahead(
        &self,
        own: &Entry,
        queue: &QueueId,
        kind: Option<EntryKind>,
        nearest: usize,
    ) -> Result<Vec<Peer>> {
        let reply = self
            .call(
                "read queue",
                &scripts::STILL_AHEAD,
                vec![
                    arg(queue_path(queue)),
                    arg(&own.key),
                    arg(own.token.get()),
                    arg(filter_code(kind)),
                    arg(nearest),
                ],
            )
            .await?;
        let a = array(&reply).ok_or_else(|| unexpected("read queue"))?;
        match a.first().and_then(int) {
            Some(0) => Err(Self::vanished(own)),
            Some(1) => a
                .get(1)
                .and_then(peers)
                .ok_or_else(|| unexpected("read queue")),
            _ => Err(unexpected("read queue")),
        }
    }

    async fn wait_own_gone(&self, own: &Entry) -> Result<()> {
        let reg = self.notifier.register(chan_entry(&own.key)).await?;
        while self.read_own(own, false).await?.is_some() {
            reg.notified().await?;
        }
        Ok(())
    }

    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let _changing = self.gate.read().await;
        let reply = self
            .call(
                "release",
                &scripts::REMOVE,
                vec![arg(&entry.key), arg(entry.token.get()), arg(self.known())],
            )
            .await?;
        let a = array(&reply).ok_or_else(|| unexpected("release"))?;
        let removed = a.first().and_then(int) == Some(1);
        let mut o = self.owned();
        o.untrack(&entry.key);
        o.saw(
            a.get(1).and_then(int).filter(|v| *v >= 0),
            a.get(2).and_then(int),
        );
        Ok(removed)
    }

    async fn abandon(&self, queue: &QueueId, kind: EntryKind, attempt: Uuid) -> Result<()> {
        let name = entry_name(queue, &self.sid, kind, attempt);
        let _changing = self.gate.read().await;
        let reply = self
            .call(
                "abandon",
                &scripts::ABANDON,
                vec![
                    arg(queue_path(queue)),
                    arg(&name),
                    arg(&self.sid),
                    arg(self.known()),
                ],
            )
            .await?;
        let a = array(&reply).ok_or_else(|| unexpected("abandon"))?;
        let mut o = self.owned();
        o.untrack(&name);
        o.saw(
            a.first().and_then(int).filter(|v| *v >= 0),
            a.get(1).and_then(int),
        );
        Ok(())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        check_value(value)?;
        let reply = self
            .call(
                "proclaim",
                &scripts::SET_VALUE,
                vec![arg(&entry.key), arg(entry.token.get()), value.to_vec()],
            )
            .await?;
        Ok(int(&reply) == Some(1))
    }

    async fn head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> {
        Ok(self.head_with_ttl(queue).await?.map(|(head, _)| head))
    }

    async fn wait_queue_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()> {
        let reg = self.notifier.register(chan_head(queue)).await?;
        let now = self.head_with_ttl(queue).await?;
        if now.as_ref().map(|(h, _)| h) != seen {
            return Ok(());
        }
        match now {
            // The head's session expires without a message: look again when it would.
            Some((_, left)) => tokio::select! {
                r = reg.notified() => r.map(drop),
                _ = tokio::time::sleep(left + EXPIRY_SLACK) => Ok(()),
            },
            None => reg.notified().await.map(drop),
        }
    }

    async fn inspect(&self, queue: &QueueId) -> Result<Vec<EntryInfo>> {
        let reply = self
            .call("inspect", &scripts::INSPECT, vec![arg(queue_path(queue))])
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

    async fn list(&self, namespace: &str) -> Result<Vec<String>> {
        let mut con = self.con.clone();
        let glob = entries_glob(namespace);
        let strip = format!("{KEY_PREFIX}:e:");
        let mut names = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            // Raw bytes: a foreign key that is not UTF-8 under our prefix is skipped, rather
            // than failing the whole listing (fencelock's own names are UTF-8).
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&glob)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut con)
                .await
                .map_err(|e| map("list", e))?;
            names.extend(keys.into_iter().filter_map(|k| {
                String::from_utf8(k)
                    .ok()?
                    .strip_prefix(&strip)
                    .map(str::to_string)
            }));
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut live = Vec::with_capacity(names.len());
        for chunk in names.chunks(LIST_CHUNK) {
            let reply = self
                .call("list", &scripts::LIVE, chunk.iter().map(arg).collect())
                .await?;
            let a = array(&reply).ok_or_else(|| unexpected("list"))?;
            live.extend(a.iter().filter_map(text));
        }
        live.sort();
        live.dedup();
        Ok(live)
    }

    async fn request_revoke(&self, key: &str, token: FencingToken) -> Result<bool> {
        let reply = self
            .call(
                "request revoke",
                &scripts::SET_VALUE,
                vec![arg(key), arg(token.get()), REVOKE_MARKER.to_vec()],
            )
            .await?;
        Ok(int(&reply) == Some(1))
    }

    async fn wait_revoke(&self, own: &Entry) -> Result<()> {
        let reg = self.notifier.register(chan_entry(&own.key)).await?;
        loop {
            match self.read_own(own, true).await? {
                None => return Err(Self::vanished(own)),
                Some(v) if v == REVOKE_MARKER => return Ok(()),
                Some(_) => {
                    reg.notified().await?;
                }
            }
        }
    }
}
