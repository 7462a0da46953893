//! One etcd lease per session, kept alive by one keep-alive stream.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use fencelock::backend::{BackendSession, Entry, QueueId};
use fencelock::{Error, LostReason, Result};
use tokio::sync::Mutex as AsyncMutex;
use uuid::Uuid;

use crate::error::{map, temporary};
use crate::queue::{direct_children, entry_of, prefix_of};
use crate::watch::KeyWatcher;

pub(crate) struct EtcdSession {
    client: Client,
    lease: i64,
    ttl: Duration,
    keeper: AsyncMutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    /// Watches on the keys this session waits for, on one watch stream.
    watcher: KeyWatcher,
}

impl std::fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSession")
            .field("lease", &format_args!("{:x}", self.lease))
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl EtcdSession {
    pub(crate) async fn open(mut client: Client, ttl: Duration) -> Result<Self> {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let grant = client
            .lease_grant(secs as i64, None)
            .await
            .map_err(|e| map("lease grant", e))?;
        if !grant.error().is_empty() {
            return Err(Error::backend(
                "etcd",
                "lease grant",
                false,
                grant.error().to_string(),
            ));
        }
        Ok(EtcdSession {
            client: client.clone(),
            lease: grant.id(),
            ttl: Duration::from_secs(grant.ttl().max(0) as u64),
            keeper: AsyncMutex::new(None),
            watcher: KeyWatcher::new(client.clone()),
        })
    }

    fn key(&self, queue: &QueueId) -> String {
        format!("{}{:x}", prefix_of(queue), self.lease)
    }

    /// Reads `key`: its create revision, or `None` if absent.
    async fn create_rev(&self, key: &str) -> Result<Option<u64>> {
        let resp = self
            .client
            .clone()
            .get(key, Some(GetOptions::new().with_keys_only()))
            .await
            .map_err(|e| map("get", e))?;
        Ok(resp.kvs().first().map(|kv| kv.create_revision() as u64))
    }
}

fn sorted_queue(ascending: bool) -> GetOptions {
    let order = if ascending {
        SortOrder::Ascend
    } else {
        SortOrder::Descend
    };
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
}

#[async_trait]
impl BackendSession for EtcdSession {
    fn id(&self) -> String {
        format!("{:x}", self.lease)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn keep_alive(&self) -> Result<()> {
        let mut slot = self.keeper.lock().await;
        // Taken out while in flight: if this future is cancelled, the stream is dropped with
        // it, so a late reply can never confirm a later heartbeat.
        let (mut keeper, mut stream) = match slot.take() {
            Some(ks) => ks,
            None => {
                // Opening the stream sends the first keep-alive and waits for its reply.
                let ks = self
                    .client
                    .lease_client()
                    .keep_alive(self.lease)
                    .await
                    .map_err(|e| map("keep-alive", e))?;
                *slot = Some(ks);
                return Ok(());
            }
        };
        keeper
            .keep_alive()
            .await
            .map_err(|e| map("keep-alive", e))?;
        match stream.message().await.map_err(|e| map("keep-alive", e))? {
            Some(resp) if resp.ttl() > 0 => {
                *slot = Some((keeper, stream));
                Ok(())
            }
            Some(_) => Err(Error::SessionLost(LostReason::Expired)),
            None => Err(temporary("keep-alive", "keep-alive stream ended")),
        }
    }

    async fn enqueue(
        &self,
        queue: &QueueId,
        _attempt: Uuid,
        value: &[u8],
    ) -> Result<(Entry, bool)> {
        let key = self.key(queue);
        let prefix = prefix_of(queue);
        let read = [
            TxnOp::get(key.as_str(), None),
            TxnOp::get(prefix.as_str(), Some(sorted_queue(true).with_keys_only())),
        ];
        // Create if absent (with our lease), else find it again: the same key is derived from
        // the lease, so a retry after a lost reply finds our own entry.
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.as_str(),
                    value,
                    Some(PutOptions::new().with_lease(self.lease)),
                ),
                read[0].clone(),
                read[1].clone(),
            ])
            .or_else(read);
        let resp = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| map("enqueue", e))?;
        let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let (Some(own), Some(queue_keys)) = (gets.next(), gets.next()) else {
            return Err(temporary("enqueue", "unexpected txn reply"));
        };
        let Some(kv) = own.kvs().first() else {
            // Our lease is gone: the put with a dead lease fails instead, so this is unexpected.
            return Err(Error::SessionLost(LostReason::Expired));
        };
        let entry = entry_of(key.clone(), kv.create_revision());
        let head = direct_children(&prefix, queue_keys.kvs())
            .next()
            .is_some_and(|kv| kv.key() == key.as_bytes());
        Ok((entry, head))
    }

    async fn predecessor(&self, queue: &QueueId, entry: &Entry) -> Result<Option<Entry>> {
        let prefix = prefix_of(queue);
        let opts = sorted_queue(false)
            .with_keys_only()
            .with_max_create_revision(entry.order as i64 - 1);
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.as_str(),
                CompareOp::Equal,
                entry.order as i64,
            )])
            .and_then([TxnOp::get(prefix.as_str(), Some(opts))]);
        let resp = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| map("predecessor", e))?;
        if !resp.succeeded() {
            return Err(Error::EntryVanished {
                key: entry.key.clone(),
            });
        }
        let Some(TxnOpResponse::Get(g)) = resp.op_responses().into_iter().next() else {
            return Err(temporary("predecessor", "unexpected txn reply"));
        };
        let pred = direct_children(&prefix, g.kvs()).next().map(|kv| {
            entry_of(
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.create_revision(),
            )
        });
        Ok(pred)
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        // Watch the key from now, then re-read it comparing the create revision (a key name
        // repeats when a session queues again): no deletion can slip between the two.
        let reg = self.watcher.register(&entry.key).await?;
        let res = match self.create_rev(&entry.key).await? {
            Some(rev) if rev == entry.order => reg.wait().await,
            _ => Ok(()),
        };
        self.watcher.prune_if_large().await;
        res
    }

    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.as_str(),
                CompareOp::Equal,
                entry.order as i64,
            )])
            .and_then([TxnOp::delete(entry.key.as_str(), None)]);
        let resp = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| map("release", e))?;
        Ok(resp.succeeded())
    }

    async fn abandon(&self, queue: &QueueId, _attempt: Uuid) -> Result<()> {
        // The key is ours alone (derived from our lease) and the caller holds the session's
        // local slot for this queue, so whatever entry is there belongs to the abandoned
        // attempt. Delete it guarded by its create revision, never unconditionally: a request
        // that reaches the cluster late (sent through a member that died, say) must not delete
        // an entry this session creates afterwards.
        let key = self.key(queue);
        if let Some(rev) = self.create_rev(&key).await? {
            self.remove(&entry_of(key, rev as i64)).await?;
        }
        Ok(())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.as_str(),
                CompareOp::Equal,
                entry.order as i64,
            )])
            .and_then([TxnOp::put(
                entry.key.as_str(),
                value,
                Some(PutOptions::new().with_lease(self.lease)),
            )]);
        let resp = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| map("proclaim", e))?;
        Ok(resp.succeeded())
    }

    async fn head(&self, queue: &QueueId) -> Result<Option<(Entry, Vec<u8>)>> {
        let prefix = prefix_of(queue);
        let resp = self
            .client
            .kv_client()
            .get(prefix.as_str(), Some(sorted_queue(true)))
            .await
            .map_err(|e| map("leader", e))?;
        let head = direct_children(&prefix, resp.kvs()).next().map(|kv| {
            (
                entry_of(
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.create_revision(),
                ),
                kv.value().to_vec(),
            )
        });
        Ok(head)
    }

    async fn wait_queue_change(
        &self,
        queue: &QueueId,
        seen: Option<&(Entry, Vec<u8>)>,
    ) -> Result<()> {
        let prefix = prefix_of(queue);
        let mut stream = self
            .client
            .watch_client()
            .watch(
                prefix.as_str(),
                Some(etcd_client::WatchOptions::new().with_prefix()),
            )
            .await
            .map_err(|e| map("observe", e))?;
        match stream.message().await.map_err(|e| map("observe", e))? {
            Some(r) if r.created() && !r.canceled() => {}
            _ => return Err(temporary("observe", "watch was not created")),
        }
        let now = self.head(queue).await?;
        let same = match (&now, seen) {
            (None, None) => true,
            (Some((e, v)), Some((se, sv))) => e == se && v == sv,
            _ => false,
        };
        if !same {
            return Ok(());
        }
        loop {
            match stream.message().await.map_err(|e| map("observe", e))? {
                Some(r) if r.canceled() => {
                    return Err(temporary("observe", "watch canceled"));
                }
                Some(r) if !r.events().is_empty() => return Ok(()),
                Some(_) => {}
                None => return Err(temporary("observe", "watch ended")),
            }
        }
    }

    async fn list(&self, namespace: &str) -> Result<Vec<String>> {
        let resp = self
            .client
            .kv_client()
            .get(
                format!("{namespace}/"),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(|e| map("list", e))?;
        let mut keys: Vec<String> = resp
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        keys.sort();
        Ok(keys)
    }

    async fn close(&self) -> Result<()> {
        match self.client.lease_client().revoke(self.lease).await {
            Ok(_) => Ok(()),
            Err(e) => match map("close", e) {
                Error::SessionLost(_) => Ok(()),
                other => Err(other),
            },
        }
    }
}
