//! Guarded writes: a Redis write that applies only while a lock or leadership is held.

use std::sync::LazyLock;

use fencelock::{Holding, Result};
use redis::aio::ConnectionLike;
use redis::Script;

use crate::error::map;

/// `SET KEYS[1] ARGV[3]` only if entry ARGV[1] is live with token ARGV[2].
static GUARDED_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local e = redis.call('HMGET', 'fencelock:e:' .. ARGV[1], 's', 't')
if not e[1] or tonumber(e[2]) ~= tonumber(ARGV[2]) then return 0 end
if redis.call('EXISTS', 'fencelock:s:' .. e[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[3])
return 1
"#,
    )
});

/// Sets `key` to `value` in the same Redis only while `grant` (a
/// [`Guard`](fencelock::Guard), a write guard, a [`Leadership`](fencelock::Leadership)) is
/// held: its entry still exists with its token and its session has not expired, checked by
/// Redis atomically with the write. Returns whether it was written. A holder paused past its
/// session's TTL is refused by Redis itself, even though it does not know yet that it lost.
///
/// ```no_run
/// # async fn run(session: fencelock::Session, backend: fencelock_redis::RedisBackend) -> fencelock::Result<()> {
/// let guard = session.mutex("config/publisher")?.lock().await?;
/// let mut con = backend.connection();
/// if !fencelock_redis::guarded_set(&mut con, &guard, "config/current", b"v42").await? {
///     // The lock was lost: nothing was written.
/// }
/// # Ok(()) }
/// ```
pub async fn guarded_set(
    con: &mut impl ConnectionLike,
    grant: &(impl Holding + Sync),
    key: &str,
    value: &[u8],
) -> Result<bool> {
    let applied: i64 = GUARDED_SET
        .key(key)
        .arg(grant.key())
        .arg(grant.token().get())
        .arg(value)
        .invoke_async(con)
        .await
        .map_err(|e| map("guarded set", e))?;
    Ok(applied == 1)
}
