//! Revocation requests on ZooKeeper: the request written into the holder's entry node, and the
//! holder's wait for one (a data watch on its own node).

use fencelock::backend::{Entry, REVOKE_MARKER};
use fencelock::{Error, FencingToken, Result};
use zookeeper_client as zk;

use crate::error::{self};
use crate::lifecycle::ZkSession;
use crate::watch::DataWatch;

/// How often a revocation request retries when the node's data changes under it.
const REVOKE_ATTEMPTS: usize = 5;

pub(crate) async fn request_revoke(
    session: &ZkSession,
    key: &str,
    token: FencingToken,
) -> Result<bool> {
    session
        .unless_moved("request_revoke", async {
            session.revoke_at(key, token).await
        })
        .await
}

pub(crate) async fn wait_revoke(session: &ZkSession, own: &Entry) -> Result<()> {
    session
        .unless_moved("wait_revoke", async { session.wait_revoked(own).await })
        .await
}

impl ZkSession {
    /// Writes [`REVOKE_MARKER`] into the node at `key` if it is still the entry with `token`
    /// (its czxid), as Curator's `Revoker` does: a conditional `setData` on the version just
    /// read, so that the request never lands on another node.
    pub(crate) async fn revoke_at(&self, key: &str, token: FencingToken) -> Result<bool> {
        const OP: &str = "request revoke";
        for _ in 0..REVOKE_ATTEMPTS {
            let client = self.client()?;
            let stat = match client.check_stat(key).await {
                Ok(Some(stat)) if stat.czxid as u64 == token.get() => stat,
                Ok(_) => return Ok(false),
                Err(e) => return Err(error::map(OP, e)),
            };
            match client
                .set_data(key, REVOKE_MARKER, Some(stat.version))
                .await
            {
                Ok(_) => return Ok(true),
                Err(zk::Error::NoNode) => return Ok(false),
                Err(zk::Error::BadVersion) => continue, // changed meanwhile: read again
                Err(e) => return Err(error::map(OP, e)),
            }
        }
        Err(Error::backend(
            error::NAME,
            OP,
            true,
            "the node's data kept changing",
        ))
    }

    /// Resolves once the data of `own` is [`REVOKE_MARKER`]; fails with `EntryVanished` once
    /// it is gone. One data watch on the node, re-armed after each change.
    pub(crate) async fn wait_revoked(&self, own: &Entry) -> Result<()> {
        // Our own node: a wait given up (a dropped `revoke_requested()`) removes its watch.
        let vanished = || Error::EntryVanished {
            key: own.key.clone(),
        };
        let w = DataWatch {
            op: "watch revoke",
            path: &own.key,
            own: None,
            gone: || Err(vanished()),
        };
        self.watch_data(w, |data, stat| {
            if stat.czxid as u64 != own.token.get() {
                Some(Err(vanished()))
            } else {
                (data == REVOKE_MARKER).then_some(Ok(()))
            }
        })
        .await
    }
}
