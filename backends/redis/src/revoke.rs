//! Revocation requests on Redis: the request written into the holder's entry, and the
//! holder's wait for one.

use fencelock::backend::{Entry, REVOKE_MARKER};
use fencelock::{FencingToken, Result};

use crate::layout::chan_entry;
use crate::lifecycle::RedisSession;
use crate::reply::{args, int};
use crate::scripts;

pub(crate) async fn request_revoke(
    session: &RedisSession,
    key: &str,
    token: FencingToken,
) -> Result<bool> {
    // A name that is no entry's has no entry to ask.
    let Some(group) = session.groups.of_entry(key) else {
        return Ok(false);
    };
    let reply = session
        .call(
            "request revoke",
            &scripts::SET_VALUE,
            &group,
            args![key, token.get(), REVOKE_MARKER],
        )
        .await?;
    Ok(int(&reply) == Some(1))
}

pub(crate) async fn wait_revoke(session: &RedisSession, own: &Entry) -> Result<()> {
    let reg = session.notifier.register(chan_entry(&own.key)).await?;
    loop {
        match session.read_own(own, true).await? {
            None => return Err(RedisSession::vanished(own)),
            Some(v) if v == REVOKE_MARKER => return Ok(()),
            // Read again at the latest after `recheck_every` (a change made outside the
            // scripts publishes nothing).
            Some(_) => {
                let every = fencelock_net::recheck_every(session.ttl);
                if let Ok(notified) = tokio::time::timeout(every, reg.notified()).await {
                    notified?;
                }
            }
        }
    }
}
