//! The lifecycle of a Redis session (a session key with a TTL, opened and closed by one script
//! each; its heartbeat is in `heartbeat.rs`), and the plumbing its operations share.

use std::collections::HashSet;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use fencelock::backend::{Backoff, Entry, QueueId, Retry};
use fencelock::{Error, Result, SessionEnd};
use redis::Value;
use tokio::sync::RwLock;
use uuid::Uuid;

use crate::config::RedisConfig;
use crate::error::{unexpected, NAME};
use crate::layout::{kind_of, queue_path, Group, Groups};
use crate::own_channel::OwnChannel;
use crate::owned::Owned;
use crate::primary::Primary;
use crate::replicas::Acks;
use crate::reply::{args, array, bytes, entry, int, ms, text, Args};
use crate::scripts::{self, Op};
use crate::watch::Notifier;

/// How much later than the predecessor's session expiry a waiter re-checks it: Redis expires
/// a key when it is read at or after its deadline, so a little slack is enough.
pub(crate) const EXPIRY_SLACK: Duration = Duration::from_millis(20);

/// One session: its key, its connection, and the gate that orders creates against its end.
pub(crate) struct RedisSession {
    pub(crate) primary: Arc<Primary>,
    /// With `wait_for_replicas`: where creates and heartbeats go, each followed by a `WAIT`.
    pub(crate) acked: Option<Arc<Acks>>,
    pub(crate) sid: String,
    pub(crate) ttl: Duration,
    /// Where queues' keys live (one group on a server, many on a cluster).
    pub(crate) groups: Groups,
    pub(crate) notifier: Notifier,
    pub(crate) owned: StdMutex<Owned>,
    /// The entries (name, token) that a release named, live, as their queue's new head when it
    /// ended their wait: the `still_ahead` that follows the wait answers without a read.
    pub(crate) headed: StdMutex<HashSet<(String, u64)>>,
    /// The session's own channel, where a deletion names the entry right behind it.
    pub(crate) own_channel: OwnChannel,
    /// Held, shared, by every change of what the session owns, from tracking it to its reply;
    /// a reconciliation takes it alone, so that it never deletes a create in flight.
    pub(crate) gate: RwLock<()>,
    /// Whether a divergence (changes the server lost) is being reconciled and was reported:
    /// reported once, not at each heartbeat while reconciliation fails.
    pub(crate) reconciling: std::sync::atomic::AtomicBool,
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
pub(crate) fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > fencelock::backend::MAX_VALUE_LEN {
        return Err(Error::InvalidValue(fencelock::InvalidInput::new(
            format!("{} bytes", value.len()),
            "longer than the largest value accepted",
        )));
    }
    Ok(())
}

impl RedisSession {
    pub(crate) async fn open(
        primary: Arc<Primary>,
        config: Arc<RedisConfig>,
        acked: Option<Arc<Acks>>,
        ttl: Duration,
    ) -> Result<Self> {
        // A random id: a counter could hand out a live session's id again after a failover
        // lost its increments.
        let groups = primary.groups();
        let session = RedisSession {
            notifier: Notifier::new(primary.clone(), config.timeout, ttl),
            groups,
            primary,
            acked,
            sid: Uuid::new_v4().simple().to_string(),
            ttl,
            owned: StdMutex::default(),
            headed: StdMutex::default(),
            own_channel: OwnChannel::default(),
            gate: RwLock::new(()),
            reconciling: std::sync::atomic::AtomicBool::new(false),
        };
        if groups == Groups::Cluster {
            // On a cluster a session has keys only in the groups of its entries (made by its
            // first create in each): it depends on those shards alone.
            session.ping().await?;
            return Ok(session);
        }
        let single = Group::single();
        let reply = session
            .create_call(
                "open session",
                &scripts::OPEN,
                &single,
                args![&session.sid, ms(ttl)],
            )
            .await?;
        if int(&reply) != Some(1) {
            return Err(unexpected("open session"));
        }
        session.owned().saw(&single, Some(0), None, 0);
        Ok(session)
    }

    pub(crate) async fn call(
        &self,
        op: &'static str,
        script: &Op,
        group: &Group,
        args: Args,
    ) -> Result<Value> {
        let mut con = self.primary.con();
        let bound = self.primary.timeout();
        // Bounded here as documented (each request at most the timeout): the connection
        // manager makes a request wait for its reconnect, two connects and a backoff more.
        let request = tokio::time::timeout(
            bound,
            self.primary
                .runner
                .run(&mut con, script, group.key(), &args),
        );
        // On a cluster, a request still unanswered after one attempt's time has the connection
        // made again (see `Primary::rebuild`), while it goes on waiting: the heartbeat's own
        // patience may end it before its timeout would tell.
        let reply = match self.primary.cluster_attempt() {
            Some(attempt) => {
                tokio::pin!(request);
                match tokio::time::timeout(attempt, &mut request).await {
                    Ok(reply) => reply,
                    Err(_) => {
                        self.primary.rebuild();
                        request.await
                    }
                }
            }
            None => request.await,
        };
        match reply {
            Ok(reply) => reply.map_err(|e| self.primary.failed(op, e)),
            Err(_) => Err(self.primary.failed(
                op,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {bound:?}"),
                )
                .into(),
            )),
        }
    }

    /// A call that creates something a failover must not lose: acknowledged by the replicas
    /// when the backend is configured to wait for them.
    pub(crate) async fn create_call(
        &self,
        op: &'static str,
        script: &Op,
        group: &Group,
        args: Args,
    ) -> Result<Value> {
        match &self.acked {
            Some(acks) => acks.creates.run(op, script, group, &args).await,
            None => self.call(op, script, group, args).await,
        }
    }

    /// A heartbeat: acknowledged by the replicas too when the backend waits for them, so that
    /// a promoted replica has the session's renewed expiry (the local deadline counts from the
    /// heartbeat's send time, and must not outlast what the replica knows).
    pub(crate) async fn heartbeat_call(
        &self,
        script: &Op,
        group: &Group,
        args: Args,
    ) -> Result<Value> {
        match &self.acked {
            Some(acks) => {
                acks.heartbeats
                    .run("keep-alive", script, group, &args)
                    .await
            }
            None => self.call("keep-alive", script, group, args).await,
        }
    }

    /// A `PING` (on a cluster, to any node): a heartbeat of a session that has no key.
    pub(crate) async fn ping(&self) -> Result<()> {
        crate::cluster::ping_one(&mut self.primary.con())
            .await
            .map_err(|e| self.primary.failed("keep-alive", e))
    }

    /// The group of the entry named `name` (one of fencelock's names: its queue's group).
    pub(crate) fn entry_group(&self, name: &str) -> Result<Group> {
        self.groups
            .of_entry(name)
            .ok_or_else(|| Error::EntryVanished {
                key: name.to_string(),
            })
    }

    /// Records that `own` headed its queue, live, when the release that woke its wait ran.
    pub(crate) fn headed(&self, own: &Entry) {
        self.headed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((own.key.clone(), own.token.get()));
    }

    /// Whether `own` was recorded as heading its queue (forgotten once asked).
    pub(crate) fn took_head(&self, own: &Entry) -> bool {
        let mut headed = self.headed.lock().unwrap_or_else(|e| e.into_inner());
        // Most often empty (the key is cloned only to look it up).
        !headed.is_empty() && headed.remove(&(own.key.clone(), own.token.get()))
    }

    /// Forgets what was recorded for the entry named `name`, whatever its token.
    pub(crate) fn forget_head(&self, name: &str) {
        self.headed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(key, _)| key != name);
    }

    pub(crate) fn known(&self, group: &Group) -> i64 {
        self.owned().known(group)
    }

    pub(crate) fn owned(&self) -> std::sync::MutexGuard<'_, Owned> {
        self.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After a failover lost some of this session's changes in `group`: deletes the entries
    /// there the session does not believe it owns (released ones that came back) and moves the
    /// version past both. The caller holds the gate alone.
    pub(crate) async fn reconcile(&self, group: &Group) -> Result<()> {
        let (known, names) = {
            let o = self.owned();
            let names = o
                .names
                .keys()
                .filter(|n| self.groups.of_entry(n).as_ref() == Some(group))
                .cloned()
                .collect::<Vec<_>>();
            (o.known(group), names)
        };
        let mut args = args![&self.sid, known];
        for name in &names {
            args.push(name);
        }
        let reply = self
            .call("reconcile", &scripts::RECONCILE, group, args)
            .await?;
        match int(&reply) {
            Some(v) if v >= 0 => {
                let mut o = self.owned();
                let g = o.groups.entry(group.clone()).or_default();
                g.version = g.version.max(v);
                g.diverged = false;
                Ok(())
            }
            Some(_) => Err(Error::SessionLost(SessionEnd::Expired)),
            None => Err(unexpected("reconcile")),
        }
    }

    pub(crate) fn vanished(own: &Entry) -> Error {
        Error::EntryVanished {
            key: own.key.clone(),
        }
    }

    /// Whether `own` is live, and its value if `value`.
    pub(crate) async fn read_own(&self, own: &Entry, value: bool) -> Result<Option<Vec<u8>>> {
        let reply = self
            .call(
                "read entry",
                &scripts::READ_OWN,
                &self.entry_group(&own.key)?,
                args![&own.key, own.token.get(), if value { "1" } else { "0" },],
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
    pub(crate) async fn head_with_ttl(
        &self,
        queue: &QueueId,
    ) -> Result<Option<((Entry, Vec<u8>), Duration)>> {
        let reply = self
            .call(
                "leader",
                &scripts::HEAD,
                &self.groups.of_queue(queue),
                args![queue_path(queue)],
            )
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

pub(crate) async fn close(session: &RedisSession) -> Result<()> {
    session.notifier.shutdown().await;
    let groups: Vec<Group> = session.owned().groups.keys().cloned().collect();
    // While a Redis Cluster's slot migrates, a script that meets a key of it already moved
    // (or not yet) fails for a moment ("non local key"), and the caller of `close` got that
    // error (the CLI printed it): on a cluster, each group's close is tried again on a
    // temporary error, the whole within the request timeout (the script is idempotent, and
    // touches only this session's keys). Elsewhere a temporary error is a server away, which
    // waiting would not mend; the session's background task goes on closing it either way.
    let bound = session.primary.timeout();
    let until = tokio::time::Instant::now() + bound;
    let closes = groups.iter().map(|g| async move {
        let once = || session.call("close", &scripts::CLOSE, g, args![&session.sid]);
        if session.groups != Groups::Cluster {
            return once().await;
        }
        let tries = Retry::new(Backoff::capped(Duration::from_millis(200)))
            .until(until)
            .counted(NAME)
            .run(once, Error::is_temporary);
        match tokio::time::timeout_at(until, tries).await {
            Ok(done) => done,
            Err(_) => Err(Error::backend(
                NAME,
                "close",
                true,
                format!("no answer within {bound:?}"),
            )),
        }
    });
    for r in futures_util::future::join_all(closes).await {
        r?;
    }
    Ok(())
}
