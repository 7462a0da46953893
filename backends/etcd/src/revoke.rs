//! Revocation requests on etcd: the request written into the holder's entry, and the holder's
//! wait for one.

use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp};
use fencelock::backend::{Entry, REVOKE_MARKER};
use fencelock::{Error, FencingToken, Result};

use crate::error::{map, temporary, watch_refused};
use crate::lifecycle::EtcdSession;
use crate::request::within;

pub(crate) async fn request_revoke(
    session: &EtcdSession,
    key: &str,
    token: FencingToken,
) -> Result<bool> {
    // The holder's lease stays on the key (`ignore_lease`): the request changes the value
    // only, and only of that very entry.
    let txn = Txn::new()
        .when([Compare::create_revision(
            key,
            CompareOp::Equal,
            token.get() as i64,
        )])
        .and_then([TxnOp::put(
            key,
            REVOKE_MARKER,
            Some(PutOptions::new().with_ignore_lease()),
        )]);
    Ok(session.txn("request revoke", txn).await?.succeeded())
}

pub(crate) async fn wait_revoke(session: &EtcdSession, own: &Entry) -> Result<()> {
    // A watch stream of its own, for as long as a holder awaits `revoke_requested()`: the
    // shared stream watches deletions only.
    let vanished = || Error::EntryVanished {
        key: own.key.clone(),
    };
    let mut watches = session.client.watch_client();
    let opened = watches.watch(own.key.as_str(), None);
    let mut stream = within(session.bound, "watch revoke", opened).await?;
    match within(session.bound, "watch revoke", stream.message()).await? {
        Some(r) if r.created() && !r.canceled() => {}
        Some(r) if r.canceled() => return Err(watch_refused(r.cancel_reason())),
        _ => return Err(temporary("watch revoke", "watch was not created")),
    }
    let mut kv = session.client.kv_client();
    let resp = within(
        session.bound,
        "watch revoke",
        kv.get(own.key.as_str(), None),
    )
    .await?;
    match resp.kvs().first() {
        Some(kv) if kv.create_revision() as u64 == own.order => {
            if kv.value() == REVOKE_MARKER {
                return Ok(());
            }
        }
        _ => return Err(vanished()),
    }
    loop {
        let Some(r) = stream.message().await.map_err(|e| map("watch revoke", e))? else {
            return Err(temporary("watch revoke", "watch ended"));
        };
        if r.canceled() {
            return Err(temporary("watch revoke", "watch canceled"));
        }
        for ev in r.events() {
            match (ev.event_type(), ev.kv()) {
                (EventType::Put, Some(kv)) if kv.create_revision() as u64 == own.order => {
                    if kv.value() == REVOKE_MARKER {
                        return Ok(());
                    }
                }
                _ => return Err(vanished()),
            }
        }
    }
}
