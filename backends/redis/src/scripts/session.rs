//! The scripts of a session's own life: opening it, its heartbeat, reconciling what it owns
//! after a failover, closing it (the queue's scripts are in `scripts.rs`).

use std::sync::LazyLock;

use super::Op;

/// ARGV: sid (random), ttl ms. Creates the session's key; 0 if a session with that id exists.
pub(crate) static OPEN: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "open",
        r#"
if redis.call('EXISTS', skey(ARGV[1])) == 1 then return 0 end
redis.call('HSET', skey(ARGV[1]), 'v', '0')
redis.call('PEXPIRE', skey(ARGV[1]), ARGV[2])
return 1
"#,
    )
});

/// ARGV: sid, ttl ms, the version the client knows, whether the session's key in this group
/// was confirmed ('1'; else its first enqueue here is in flight). Extends the session and
/// everything it owns; returns {-1} if the confirmed key is gone, {-2} if an unconfirmed one
/// is not there (yet), else {version, behind}.
pub(crate) static KEEP_ALIVE: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "keep_alive",
        r#"
local sid, ttl = ARGV[1], ARGV[2]
if redis.call('PEXPIRE', skey(sid), ttl) == 0 then
  if ARGV[4] == '1' then return {-1} end
  return {-2}
end
local v = version(sid)
local late = behind(v, ARGV[3])
-- Each entry's keys unguarded (a guard per entry would cost as much as the heartbeat): only
-- expiries are extended, and on a cluster an entry not found is left owned (its release
-- takes it out), so a half-moved slot can only delay an extension. (On a node that lost a
-- key to a migration the first such access stops the script, to be retried.)
for _, name in ipairs(redis.call('HKEYS', skey(sid))) do
  if name ~= 'v' then
    local e = redis.call('HMGET', P .. ':e:' .. name, 's', 'q')
    if e[1] == sid then
      redis.call('PEXPIRE', P .. ':e:' .. name, ttl)
      extend_expiring(P .. ':q:' .. e[2], ttl)
    elseif e[1] or not GUARD then
      -- Its hash gone (deleted by hand, evicted; on one server, where keys need no guard):
      -- what it left in its queue is dropped, and the entry behind it woken. So is our wait
      -- on it, if it listens on the session's own channel: told that something is ahead, it
      -- reads, and finds its entry gone (it waited on until its predecessor's session would
      -- have expired: a TTL).
      if not e[1] then
        local token = drop_leftover(name)
        if token then redis.call('PUBLISH', C .. ':w:' .. sid, name .. ' ' .. token .. ' ahead') end
      end
      redis.call('HDEL', skey(sid), name)
    end
  end
end
return {v, late}
"#,
    )
});

/// ARGV: sid, the version the client knows, then the names of every entry the client
/// believes the session owns (or is creating). Deletes the session's other entries (released
/// ones that came back with a failover), raises the version above both, and returns it; -1 if
/// the session is gone.
pub(crate) static RECONCILE: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "reconcile",
        r#"
local sid = ARGV[1]
if redis.call('EXISTS', skey(sid)) == 0 then return -1 end
local keep = {}
for i = 3, #ARGV do keep[ARGV[i]] = true end
keep['v'] = true
for _, name in ipairs(redis.call('HKEYS', skey(sid))) do
  if not keep[name] then
    local e = redis.call('HMGET', ekey(name), 's', 'q')
    if e[1] == sid then drop(e[2], name) end
    redis.call('HDEL', skey(sid), name)
  end
end
local v = math.max(version(sid), tonumber(ARGV[2])) + 1
redis.call('HSET', skey(sid), 'v', v)
return v
"#,
    )
});

/// ARGV: sid. Deletes the session and every entry it owns.
pub(crate) static CLOSE: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "close",
        r#"
local sid = ARGV[1]
for _, name in ipairs(redis.call('HKEYS', skey(sid))) do
  if name ~= 'v' then
    local e = redis.call('HMGET', ekey(name), 's', 'q')
    if e[1] == sid then
      drop(e[2], name)
    elseif not e[1] then
      -- Its hash gone (deleted by hand, evicted): what it left in its queue goes too.
      drop_leftover(name)
    end
  end
end
redis.call('DEL', skey(sid))
return 1
"#,
    )
});
