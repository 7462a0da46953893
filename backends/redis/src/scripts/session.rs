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
/// was confirmed ('1'; else its first enqueue here is in flight), where the last heartbeat's
/// renewal of entries stopped (an `HSCAN` cursor; '0' at first). Extends the session, and the
/// expiries of its entries and their queues, a slice at a time: every one while it owns up to
/// `WHOLE`, else at least a `SLICES`th per heartbeat, so that a cycle over them all takes at
/// most `SLICES` heartbeats (a few more if the hash grows meanwhile), each at most a TTL
/// after the last, well within the `LINGER` TTLs an entry lives past its renewal. Returns
/// {-1} if the confirmed key is gone, {-2} if an unconfirmed one is not there (yet), else
/// {version, behind, the cursor to start the next heartbeat's slice from}.
pub(crate) static KEEP_ALIVE: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "keep_alive",
        r#"
local WHOLE, SLICES = 256, 20
-- `HSCAN` below is nondeterministic: before Redis 5, a script replicated as a whole may not
-- write after it unless it replicates its effects instead.
if not SEVEN and redis.replicate_commands then redis.replicate_commands() end
local sid, ttl = ARGV[1], ARGV[2]
if redis.call('PEXPIRE', skey(sid), ttl) == 0 then
  if ARGV[4] == '1' then return {-1} end
  return {-2}
end
local v = version(sid)
local late = behind(v, ARGV[3])
local linger = lingering(ttl)
local quota = math.max(WHOLE, math.ceil(redis.call('HLEN', skey(sid)) / SLICES))
local cursor, done = ARGV[5] or '0', 0
-- Each entry's keys unguarded (a guard per entry would cost as much as the heartbeat): only
-- expiries are extended, and on a cluster an entry not found is left owned (its release
-- takes it out), so a half-moved slot can only delay an extension. (On a node that lost a
-- key to a migration the first such access stops the script, to be retried.)
repeat
  local page = redis.call('HSCAN', skey(sid), cursor, 'COUNT', tostring(quota))
  cursor = page[1]
  local fields = page[2]
  for i = 1, #fields, 2 do
    local name = fields[i]
    if name ~= 'v' then
      done = done + 1
      if redis.call('PEXPIRE', P .. ':e:' .. name, linger) == 1 then
        local path = entry_parts(name)
        if path then extend_expiring(P .. ':q:' .. path, linger) end
      elseif not GUARD then
        -- Its hash gone (deleted by hand, evicted; on one server, where keys need no guard):
        -- what it left in its queue is dropped, and the entry behind it woken. So is our wait
        -- on it, if it listens on the session's own channel: told that something is ahead, it
        -- reads, and finds its entry gone (it waited on until its predecessor's session would
        -- have expired: a TTL).
        local token = drop_leftover(name)
        if token then redis.call('PUBLISH', C .. ':w:' .. sid, name .. ' ' .. token .. ' ahead') end
        redis.call('HDEL', skey(sid), name)
      end
    end
  end
until cursor == '0' or done >= quota
return {v, late, cursor}
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
