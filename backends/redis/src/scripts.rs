//! Every change fencelock makes in Redis is one Lua script: a crash or a lost connection between
//! two steps cannot leave a half-made entry, and each operation costs one round trip. The key
//! layout is in [`crate::layout`].
//!
//! Every script takes one key, `KEYS[1]`: the token counter of the queue's group (see
//! [`crate::layout`]), whose prefix (`fencelock`, or `fencelock{G}` on a cluster) the script
//! puts before every key it computes from its arguments. On a cluster those keys are all in
//! the counter's slot (the same hash tag), so the script runs on the node that serves it.
//!
//! **How they run.** Where the server has functions (Redis 7), the scripts are the functions of
//! one library, `fencelock_{hash}` (named by a hash of its text, so that clients of different
//! versions each load their own), loaded with `FUNCTION LOAD` by the first call that finds it
//! missing and called with `FCALL`: the helpers every script shares (`scripts/prelude.lua`)
//! are then made once per load instead of once per call (about 15,000 of the server's
//! instructions per call, counted with callgrind). A server without functions, or an
//! ACL user who may not load them, runs the same scripts by `EVALSHA` (prelude and body sent
//! as one script), decided once per backend at the first call.

use std::sync::LazyLock;

mod run;
mod session;

use run::Library;
pub(crate) use run::{Op, Runner};
pub(crate) use session::{CLOSE, KEEP_ALIVE, OPEN, RECONCILE};

/// How many scripts the library has (each `LazyLock<Op>` below; a test counts them).
const OPS: usize = 15;

/// Every script, in the library.
static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let all: [&Op; OPS] = [
        &OPEN,
        &KEEP_ALIVE,
        &RECONCILE,
        &CLOSE,
        &ENQUEUE,
        &ENQUEUE_ALL,
        &STILL_AHEAD,
        &CHECK_WAIT,
        &READ_OWN,
        &ABANDON,
        &REMOVE,
        &SET_VALUE,
        &HEAD,
        &INSPECT,
        &LIVE,
    ];
    Library::new(&all)
});

/// ARGV: sid, queue path, entry name, kind, value, ttl ms, kind filter, nearest, the version
/// the client knows, whether to make the session's key in this group if missing ('1'), the
/// client's time (ms since the epoch: the entry's creation time, as inspection shows it),
/// whether to report `recent` ('1'), whether the client knows this server lost changes of the
/// session here not reconciled yet ('1': see `create`). Returns `-1` if the session is gone, else the lines
/// `token`, `version`, `behind`, the ms left to the nearest's session (-1 unless it asked for
/// the nearest of any kind), the ms left to the queue's mark that an entry of it was dropped as
/// expired (`-1` if none, or not asked: see `drop`), then
/// `name`, `token`, `kind` of each entry ahead, nearest first: one bulk string, not an array,
/// because each element of a reply costs the client's parser about 1,000 instructions
/// (callgrind) and names have no control characters.
pub(crate) static ENQUEUE: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "enqueue",
        r#"
local sid, path, name = ARGV[1], ARGV[2], ARGV[3]
-- The keys it writes, looked at before it writes any (see `guard`).
skey(sid); qkey(path); ekey(name)
local v = enter(sid, ARGV[10], ARGV[6], ARGV[9])
if not v then return '-1' end
local late = behind(v, ARGV[9])
local linger = lingering(ARGV[6])
local fresh = late == 1 or ARGV[13] == '1'
local token, created, after, empty = create(sid, path, name, ARGV[4], ARGV[5], linger, v, ARGV[11], fresh)
local want, nearest = ARGV[7], tonumber(ARGV[8])
-- The only member of its queue (an uncontended lock): nothing ahead, nothing dead to drop;
-- no range read of what is ahead (callgrind: about 4,000 of the server's instructions).
local alone = created == 1 and empty
local out, first = {}, nil
if not alone then out, first = ahead(path, token, want, nearest) end
local expired = recent(path, ARGV[12])
local wait = -1
if want == '' and nearest == 1 then wait = first or -1 end
if created == 1 then
  -- Heads the queue: no live entry of any kind ahead (the dead ones met were dropped), as
  -- `ahead` shows when it looked for every kind; else asked.
  local head = alone
  if not alone then
    if want == '' and nearest > 0 then head = #out == 0
    else head = redis.call('ZRANK', qkey(path), name) == 0 end
  end
  -- Alone in it (nothing live ahead, and nothing behind the newest token): its expiry is ours
  -- alone to set. Else extended, never shortened: others' entries count on it (behind a live
  -- entry, the queue was there before this call, with the expiry its maker set).
  if alone or (head and want == '' and nearest > 0) then
    redis.call('PEXPIRE', qkey(path), linger)
  elseif head then
    extend(qkey(path), linger)
  else
    extend_expiring(qkey(path), linger)
  end
  if head then announce(path) end
end
local reply = {token, string.format('%d', after or v), late == 1 and '1' or '0', '-1', string.format('%d', expired)}
if wait ~= -1 then reply[4] = string.format('%d', wait) end
for i = 1, #out do reply[5 + i] = out[i] end
return table.concat(reply, '\n')
"#,
    )
});

/// ARGV: sid, ttl ms, the version the client knows, whether to make the session's key in this
/// group if missing ('1'), the client's time (ms since the epoch), whether to report `recent`
/// ('1'), whether the client knows this server lost changes of the session here not
/// reconciled yet ('1': see `create`), then (queue path, entry name, kind, value) per queue (all of one group). Creates every entry only if each queue is empty of live entries but ours; returns
/// {-1} if the session is gone, {0} if a queue is taken, else {1, {token…}, version, behind,
/// the ms left to the newest mark of a queue that an entry of it was dropped as expired (-1
/// if none, or not asked: see `drop`)}.
pub(crate) static ENQUEUE_ALL: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "enqueue_all",
        r#"
local sid, ttl = ARGV[1], ARGV[2]
skey(sid)
local v = enter(sid, ARGV[4], ARGV[2], ARGV[3])
if not v then return {-1} end
local late = behind(v, ARGV[3])
local fresh = late == 1 or ARGV[7] == '1'
local expired = -1
for i = 8, #ARGV, 4 do
  local path, name = ARGV[i], ARGV[i + 1]
  while true do
    local first = redis.call('ZRANGE', qkey(path), '0', '0')[1]
    if not first then break end
    if first == name then
      -- Ours, made by a try whose reply was lost. Without its hash (deleted by hand, evicted),
      -- or on a cluster not listed by the session's key (a leftover: see `live`), it holds
      -- nothing: dropped as any dead head (`create` would move it behind the waiters and
      -- grant it all the same). So is one that a lost release may have left (`fresh`).
      if not fresh and redis.call('HGET', ekey(name), 's') == sid and owned(sid, name) then break end
    elseif live(first) then
      return {0}
    end
    drop(path, first, first ~= name)
  end
  expired = math.max(expired, recent(path, ARGV[6]))
end
local tokens = {}
local linger = lingering(ttl)
for i = 8, #ARGV, 4 do
  local token, created, after = create(sid, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], linger, v, ARGV[5], fresh)
  tokens[#tokens + 1] = token
  v = after or v
  -- Each queue was empty of live entries but ours: the entry heads it, alone (its expiry is
  -- ours to set).
  if created == 1 then
    redis.call('PEXPIRE', qkey(ARGV[i]), linger)
    announce(ARGV[i])
  end
end
return {1, tokens, v, late, expired}
"#,
    )
});

/// ARGV: queue path, entry name, token, kind filter, nearest, whether to report `recent` ('1').
/// Returns {0} if the entry is gone, else {1, {ahead…}, the ms left to the nearest's session
/// (-1 unless it asked for the nearest of any kind), the ms left to the queue's mark that an
/// entry of it was dropped as expired (-1 if none, or not asked: see `drop`)}.
pub(crate) static STILL_AHEAD: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "still_ahead",
        r#"
if not held(ARGV[2], ARGV[3]) then return {0} end
local out, first = ahead(ARGV[1], ARGV[3], ARGV[4], tonumber(ARGV[5]))
local wait = -1
if ARGV[4] == '' and ARGV[5] == '1' then wait = first or -1 end
return {1, out, wait, recent(ARGV[1], ARGV[6])}
"#,
    )
});

/// ARGV: own name, own token, target name, target token. Returns {0} if our entry is gone,
/// {1, 0} if the target is gone (dropping it if its session is), else {1, 1, the target
/// session's remaining ms}.
pub(crate) static CHECK_WAIT: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "check_wait",
        r#"
local own = held(ARGV[1], ARGV[2])
if not own then return {0} end
local path = own[4]
local score = redis.call('ZSCORE', qkey(path), ARGV[3])
if not score or score ~= ARGV[4] then return {1, 0} end
local t = live(ARGV[3])
if not t then
  drop(path, ARGV[3], true)
  return {1, 0}
end
return {1, 1, t[5]}
"#,
    )
});

/// ARGV: entry name, token, whether to return the value ('1'). Returns {0} if the entry is
/// gone, else {1} or {1, value}.
pub(crate) static READ_OWN: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "read_own",
        r#"
if not held(ARGV[1], ARGV[2]) then return {0} end
if ARGV[3] ~= '1' then return {1} end
return {1, redis.call('HGET', ekey(ARGV[1]), 'v')}
"#,
    )
});

/// ARGV: queue path, entry name, sid, the version the client knows. Deletes the entry if
/// session `sid` owns it, whatever its token (the caller does not know whether its create
/// happened), or a queue member left without its hash. Returns {-1} if the session is gone,
/// else {version, behind}.
pub(crate) static ABANDON: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "abandon",
        r#"
local path, name, sid = ARGV[1], ARGV[2], ARGV[3]
local v = version(sid)
local late = 0
if v then late = behind(v, ARGV[4]) end
local owner = redis.call('HGET', ekey(name), 's')
if owner == sid then
  drop(redis.call('HGET', ekey(name), 'q'), name)
  if v then
    redis.call('HDEL', skey(sid), name)
    v = redis.call('HINCRBY', skey(sid), 'v', '1')
  end
elseif not owner then
  redis.call('ZREM', qkey(path), name)
end
if not v then return {-1} end
return {v, late}
"#,
    )
});

/// ARGV: entry name, token, the version its owner's client knows. Deletes the entry if it is
/// still the one with that token. Returns `0` if it did not, or if the entry held nothing any
/// more (out of its queue, or its session gone: deleted all the same), else the lines `1`, the
/// owner's version, `behind` (one bulk string, as `ENQUEUE`'s); an entry out of its queue
/// gives those lines with `0` first, and so does one not found where its owner's key is there
/// (a release retried after a try whose reply was lost finds nothing, and must still learn
/// the version that try made: else a failover that lost both went unnoticed).
pub(crate) static REMOVE: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "remove",
        r#"
local e = redis.call('HMGET', ekey(ARGV[1]), 't', 'q', 's')
-- `0`, with owner `sid`'s version and `behind` where its key is there.
local function gone(sid)
  local v = sid and version(sid)
  if not v then return '0' end
  return '0\n' .. string.format('%d', v) .. (behind(v, ARGV[3]) == 1 and '\n1' or '\n0')
end
if not e[1] then
  -- Its hash gone outside the scripts (deleted by hand, evicted): its member, still in the
  -- queue with this token, would hold up the entry behind it until that one's next check
  -- (seconds): dropped, and that one woken. Still `0`: not removed by this release.
  local path, sid = entry_parts(ARGV[1])
  -- (The version before the change below: the client learns it at its next change.)
  local reply = gone(sid)
  if path and redis.call('ZSCORE', qkey(path), ARGV[1]) == ARGV[2] then
    local s = skey(sid)
    drop(path, ARGV[1])
    if redis.call('HDEL', s, ARGV[1]) == 1 then redis.call('HINCRBY', s, 'v', '1') end
  end
  return reply
end
if e[1] ~= ARGV[2] then return gone(select(2, entry_parts(ARGV[1]))) end
-- Its session's key looked at before the first write (on a cluster: a script stopped by a
-- slot moving stops before it changed anything, see `drop`).
local s = skey(e[3])
-- Out of its queue (the queue's key deleted by hand, evicted), or its session gone, it held
-- nothing: removed all the same, but no release (`0`), so that the owner learns the loss
-- (a command that exited meanwhile exits 76, not 0).
local present = drop(e[2], ARGV[1])
-- Owned (a field of its session's key): its deletion says the key is there, and the version
-- is raised at once. Else asked.
if redis.call('HDEL', s, ARGV[1]) == 0 and redis.call('EXISTS', s) == 0 then return '0' end
local v = redis.call('HINCRBY', s, 'v', '1')
-- (With its version all the same: the client follows every change of what it owns.)
return (present and '1\n' or '0\n') .. string.format('%d', v) .. (behind(v - 1, ARGV[3]) == 1 and '\n1' or '\n0')
"#,
    )
});

/// ARGV: entry name, token, value. Replaces the value of the live entry with that token, still
/// in its queue; 1 if it did.
pub(crate) static SET_VALUE: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "set_value",
        r#"
local e = live(ARGV[1])
if not e or e[2] ~= ARGV[2] then return 0 end
-- Out of its queue, it holds nothing (see `held`); its rank, read before the write, also
-- says whether it heads the queue.
local rank = redis.call('ZRANK', qkey(e[4]), ARGV[1])
if not rank then return 0 end
redis.call('HSET', ekey(ARGV[1]), 'v', ARGV[3])
redis.call('PUBLISH', C .. ':c:' .. ARGV[1], 'value')
if rank == 0 then
  redis.call('PUBLISH', C .. ':h:' .. e[4], 'value')
end
return 1
"#,
    )
});

/// ARGV: queue path. Returns {} for an empty queue, else {name, token, kind, value, the head
/// session's remaining ms}; dead heads are dropped on the way.
pub(crate) static HEAD: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "head",
        r#"
local path = ARGV[1]
while true do
  local first = redis.call('ZRANGE', qkey(path), '0', '0')[1]
  if not first then return {} end
  local e = live(first)
  if e then
    return {first, tonumber(e[2]), e[3], redis.call('HGET', ekey(first), 'v'), e[5]}
  end
  drop(path, first, true)
end
"#,
    )
});

/// ARGV: queue path. Returns every live entry in order as {name, token, kind, session,
/// created ms, value}; dead ones are dropped.
pub(crate) static INSPECT: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "inspect",
        r#"
local path = ARGV[1]
local out = {}
for _, name in ipairs(redis.call('ZRANGE', qkey(path), '0', '-1')) do
  local e = live(name)
  if e then
    local f = redis.call('HMGET', ekey(name), 'c', 'v')
    out[#out + 1] = {name, tonumber(e[2]), e[3], e[1], f[1], f[2]}
  else
    drop(path, name, true)
  end
end
return out
"#,
    )
});

/// ARGV: entry names. Returns those that are live and in their queue (out of it, the queue's
/// key deleted by hand or evicted, an entry holds nothing: see `held`).
pub(crate) static LIVE: LazyLock<Op> = LazyLock::new(|| {
    Op::new(
        "live",
        r#"
local out = {}
for _, name in ipairs(ARGV) do
  -- A foreign key under our prefix that is no hash is no entry (and HMGET on it would fail
  -- the whole listing).
  local e = redis.call('TYPE', ekey(name)).ok == 'hash' and live(name)
  if e and queued(name, e) then out[#out + 1] = name end
end
return out
"#,
    )
});

/// The scripts of [`Redlock`](crate::Redlock), one per server and step.
pub(crate) mod redlock {
    use std::sync::LazyLock;

    use redis::Script;

    /// SET NX PX on the lock key; if set, the server's token counter (0 if none), else -1.
    pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
        Script::new(
            r#"
    if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
      return tonumber(redis.call('GET', KEYS[2]) or '0')
    end
    return -1
    "#,
        )
    });

    /// Raises the token counter to ARGV[1] (never lowers it), only while we hold the lock here.
    pub(crate) static FENCE: LazyLock<Script> = LazyLock::new(|| {
        Script::new(
            r#"
    if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
    local c = tonumber(redis.call('GET', KEYS[2]) or '0')
    if c < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
    return 1
    "#,
        )
    });

    /// Deletes the lock key if it is still ours.
    pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
        Script::new(
            r#"
    if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
    return 0
    "#,
        )
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_library_has_every_script() {
        // Split, so that this line is not counted.
        let declared = [": LazyLock", "<Op> ="].concat();
        // The files that declare scripts.
        let files = [
            include_str!("scripts.rs"),
            include_str!("scripts/session.rs"),
        ];
        let count: usize = files
            .iter()
            .map(|f| f.matches(declared.as_str()).count())
            .sum();
        assert_eq!(count, super::OPS);
    }
}
