//! Guarded writes: a Redis write that applies only while a lock or leadership is held.

use std::sync::LazyLock;

use fencelock::{Error, Holding, Result};
use redis::aio::ConnectionLike;
use redis::Script;

use crate::error::map;
use crate::layout::{Groups, KEY_PREFIX};

/// `SET KEYS[1] ARGV[2]` only if entry KEYS[2] is live with token ARGV[1]: its hash is there,
/// so is its session's key (under the entry key's prefix, `fencelock` or `fencelock{G}`; on a
/// cluster, listing the entry: see `live` in `scripts/prelude.lua`), and it is still a member
/// of its queue.
/// Both keys declared: on a cluster they must share a slot, or the server refuses the script
/// (`CROSSSLOT`) before it runs.
static GUARDED_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local at = string.find(KEYS[2], ':e:', 1, true)
local P, name = string.sub(KEYS[2], 1, at - 1), string.sub(KEYS[2], at + 3)
local e = redis.call('HMGET', KEYS[2], 's', 't', 'q')
if not e[1] or tonumber(e[2]) ~= tonumber(ARGV[1]) then return 0 end
local s = P .. ':s:' .. e[1]
if redis.call('EXISTS', s) == 0 then return 0 end
if string.find(P, '{', 1, true) and redis.call('HEXISTS', s, name) == 0 then return 0 end
-- Out of its queue (the queue's key deleted by hand, or evicted) it holds nothing: the next
-- acquirer finds the queue empty, and is granted.
if e[3] and not redis.call('ZSCORE', P .. ':q:' .. e[3], name) then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"#,
    )
});

/// The hash tag of `key` as Redis Cluster reads it: what is between the first `{` and the
/// first `}` after it, if not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

/// The hash tag of the cluster group of the entry named `name` (`G` of `fencelock{G}`).
fn group_tag(name: &str) -> Option<String> {
    let group = Groups::Cluster.of_entry(name)?;
    hash_tag(group.key()).map(str::to_string)
}

/// `key` in the slot of the entry named `name` on a Redis Cluster: prefixed with the entry's
/// hash tag, `{G}` (unchanged if its first hash tag is that already).
pub(crate) fn colocated(name: &str, key: &str) -> String {
    match group_tag(name) {
        Some(tag) if hash_tag(key) == Some(tag.as_str()) => key.to_string(),
        Some(tag) => format!("{{{tag}}}{key}"),
        None => key.to_string(),
    }
}

/// Sets `key` to `value` in the same Redis only while `grant` (a
/// [`Guard`](fencelock::Guard), a write guard, a [`Leadership`](fencelock::Leadership)) is
/// held: its entry still exists with its token, is still in its queue, and its session has
/// not expired, checked by Redis atomically with the write. Returns whether it was written. A holder paused past its
/// session's TTL is refused by Redis itself, even though it does not know yet that it lost.
///
/// On a **Redis Cluster** the key must be in the slot of the grant's entry: build it with
/// [`RedisBackend::colocated_key`](crate::RedisBackend::colocated_key) (the grant's hash tag,
/// `{G}`, before the key; on one server the key as it is). A key in another slot is
/// [`Error::InvalidName`], nothing written. (On one server, a key of your own whose first hash
/// tag happens to be the grant's cluster group, `{0}` to `{1023}`, is taken for a cluster key:
/// nothing is written, `Ok(false)`; use another tag there.)
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
    // A key with the grant's cluster tag (from `colocated_key`, which adds it on a cluster
    // only) goes with the cluster's layout; any other, the single server's (a cluster then
    // refuses the two keys' different slots).
    let name = grant.key();
    let entry = match group_tag(name) {
        Some(tag) if hash_tag(key) == Some(tag.as_str()) => {
            format!("{KEY_PREFIX}{{{tag}}}:e:{name}")
        }
        _ => format!("{KEY_PREFIX}:e:{name}"),
    };
    let applied: std::result::Result<i64, _> = GUARDED_SET
        .key(key)
        .key(&entry)
        .arg(grant.token().get())
        .arg(value)
        .invoke_async(con)
        .await;
    match applied {
        Ok(applied) => Ok(applied == 1),
        Err(e) if e.code() == Some("CROSSSLOT") || e.to_string().contains("non local key") => {
            Err(Error::InvalidName(fencelock::InvalidInput::new(
                key,
                "on a Redis Cluster a guarded key must be in the slot of the lock's entry: \
                 build it with RedisBackend::colocated_key",
            )))
        }
        Err(e) => Err(map("guarded set", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::hash_tag;

    #[test]
    fn hash_tags_as_redis_reads_them() {
        assert_eq!(hash_tag("{12}x"), Some("12"));
        assert_eq!(hash_tag("a{b}c{d}"), Some("b"));
        assert_eq!(hash_tag("a{}b{c}"), None);
        assert_eq!(hash_tag("a{b"), None);
        assert_eq!(hash_tag("plain"), None);
    }
}
