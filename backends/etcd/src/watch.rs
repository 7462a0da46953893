//! One delete-watch per session: every wait on a predecessor and every held entry's
//! deletion watch share it, so a wait costs one read, not a new watch stream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions};
use fencelock::Result;
use tokio::sync::{oneshot, Mutex as AsyncMutex};
use tracing::debug;

use crate::error::{map, temporary};

type Waiters = HashMap<String, Vec<(u64, oneshot::Sender<Result<()>>)>>;

/// Watches every DELETE under a prefix (from the moment it is established) and wakes the
/// waiters registered for the deleted key.
pub(crate) struct DeleteWatch {
    client: Client,
    prefix: String,
    waiters: Arc<StdMutex<Waiters>>,
    /// Whether the watch stream is established; `None` until first use or after it broke.
    live: AsyncMutex<Option<Arc<()>>>,
}

impl std::fmt::Debug for DeleteWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeleteWatch")
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// A registered wait; dropping it unregisters.
pub(crate) struct Registration {
    rx: oneshot::Receiver<Result<()>>,
}

impl Registration {
    pub(crate) async fn wait(self) -> Result<()> {
        match self.rx.await {
            Ok(r) => r,
            Err(_) => Err(temporary("watch", "watch stream closed")),
        }
    }
}

impl DeleteWatch {
    pub(crate) fn new(client: Client, prefix: String) -> Self {
        DeleteWatch {
            client,
            prefix,
            waiters: Arc::default(),
            live: AsyncMutex::new(None),
        }
    }

    /// Registers interest in the deletion of `key` (entry with create revision `rev`) and makes
    /// sure the watch stream is established. Deletions after this returns are delivered; the
    /// caller must then read the key once to catch a deletion that happened before.
    pub(crate) async fn register(&self, key: &str, rev: u64) -> Result<Registration> {
        let (tx, rx) = oneshot::channel();
        {
            let mut w = self.waiters.lock().unwrap();
            let list = w.entry(key.to_string()).or_default();
            list.retain(|(_, tx)| !tx.is_closed());
            list.push((rev, tx));
        }
        self.ensure().await?;
        Ok(Registration { rx })
    }

    async fn ensure(&self) -> Result<()> {
        let mut live = self.live.lock().await;
        if let Some(token) = live.as_ref() {
            // The stream task holds a clone while it runs.
            if Arc::strong_count(token) > 1 {
                return Ok(());
            }
        }
        let opts = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        let mut stream = self
            .client
            .clone()
            .watch(self.prefix.as_str(), Some(opts))
            .await
            .map_err(|e| map("watch", e))?;
        // Wait for the server to confirm the watch: from then on, no deletion is missed.
        match stream.message().await.map_err(|e| map("watch", e))? {
            Some(r) if r.created() && !r.canceled() => {}
            _ => return Err(temporary("watch", "watch was not created")),
        }
        let token = Arc::new(());
        *live = Some(token.clone());
        let waiters = self.waiters.clone();
        tokio::spawn(async move {
            let _alive = token;
            let _keep_sender = &stream;
            loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        if resp.canceled() {
                            break;
                        }
                        for ev in resp.events() {
                            if ev.event_type() != EventType::Delete {
                                continue;
                            }
                            let Some(kv) = ev.kv() else { continue };
                            let Ok(key) = std::str::from_utf8(kv.key()) else {
                                continue;
                            };
                            let woken = waiters.lock().unwrap().remove(key);
                            for (_, tx) in woken.into_iter().flatten() {
                                let _ = tx.send(Ok(()));
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        debug!(error = %e, "delete watch broke");
                        break;
                    }
                }
            }
            // The stream is gone: every waiter re-checks through the core's retry.
            let all = std::mem::take(&mut *waiters.lock().unwrap());
            for (_, tx) in all.into_values().flatten() {
                let _ = tx.send(Err(temporary("watch", "watch stream broke")));
            }
        });
        Ok(())
    }
}
