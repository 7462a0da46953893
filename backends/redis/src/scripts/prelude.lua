-- The helpers every fencelock script starts with (see scripts.rs): its keys, the guard of a
-- migrating slot, and the queue operations the scripts share. Loaded once as the head of
-- fencelock's function library where the server has functions (Redis 7), else sent before each
-- script's body: either way each call starts with `begin(KEYS)`.
-- K: the call's one key, the group's token counter `{prefix}:t`; P: the group's prefix.
-- Channels are not keys: the same in every group. Set by `begin` (a script runs alone: what
-- one call sets, no other sees while it runs).
local K, P, GUARD, guarded
local C = 'fencelock'
-- Whether the server is Redis 7 or later (`PEXPIRE` takes `GT` and `NX`); set by the first
-- `begin` (while a library loads, `redis` offers only the loading calls).
local SEVEN
-- The last key of each kind made (by this call, or by an earlier one of the same group: see
-- `begin`), and what it was made from: calls ask for the same few keys again and again, and
-- each concatenation costs the server about 2,000 instructions (callgrind), a comparison of
-- two (interned) strings next to nothing.
local s_of, s_key, q_of, q_key, e_of, e_key
local function begin(keys)
  if SEVEN == nil then SEVEN = (redis.REDIS_VERSION_NUM or 0) >= 0x070000 end
  -- The same group as the last call (of a library, whose helpers outlive a call; strings are
  -- interned, so comparing them costs next to nothing): its prefix and its last keys kept.
  if keys[1] ~= K then
    K = keys[1]
    P = string.sub(K, 1, -3)
    GUARD = string.find(P, '{', 1, true) ~= nil
    s_of, q_of, e_of = nil, nil, nil
    s_key, q_key, e_key = nil, nil, nil
  end
  -- Made at the first guarded key: a table costs about 1,300 instructions.
  guarded = nil
  -- On a cluster each call guards every key it uses (see `guard`): none is kept.
  if GUARD then s_of, q_of, e_of = nil, nil, nil end
end
local function guard(key)
  if GUARD then
    guarded = guarded or {}
    if not guarded[key] then
      redis.call('TOUCH', key, K)
      guarded[key] = true
    end
  end
  return key
end
local function skey(sid)
  if sid ~= s_of then s_of, s_key = sid, guard(P .. ':s:' .. sid) end
  return s_key
end
local function qkey(path)
  if path ~= q_of then q_of, q_key = path, guard(P .. ':q:' .. path) end
  return q_key
end
local function ekey(name)
  if name ~= e_of then e_of, e_key = name, guard(P .. ':e:' .. name) end
  return e_key
end
-- How many of its session's TTLs an entry's hash and its queue live past their last renewal.
-- Whether an entry is live is its session key's to say (see `live`): these expiries only
-- clear what a session that ended without its close left where no waiter drops it. Long, so
-- that a heartbeat need not renew every entry of a session that holds many (see
-- `KEEP_ALIVE`): one that ran into every entry of a session holding 100,000 blocked the
-- server for 0.5-1 s each third of the TTL.
local LINGER = 60
-- The expiry (ms, as text) of an entry's hash and its queue, given the session's `ttl` (ms, as
-- text).
-- ('%.0f', not '%d': a 32-bit server's `long` overflows past a TTL of 35 minutes, and a
-- negative expiry deletes the key.)
local function lingering(ttl) return string.format('%.0f', tonumber(ttl) * LINGER) end
-- Queue `path`'s mark that an entry of it was dropped as expired, for `RECENT` ms (see `drop`).
local RECENT = '10000'
local function xkey(path)
  return guard(P .. ':x:' .. path)
end
-- The ms left to queue `path`'s mark (an entry of it dropped as expired `RECENT` less that
-- many ms ago), -1 if it has none or the caller does not ask (`ask` '1': a client behind
-- Sentinel; others do not read it).
local function recent(path, ask)
  if ask ~= '1' then return -1 end
  local left = redis.call('PTTL', xkey(path))
  if left < 0 then return -1 end
  return left
end
-- Whether session `sid`'s key lists entry `name`, which that session's hash names: always on
-- one server; on a cluster, else a leftover (see `live`).
local function owned(sid, name)
  return not GUARD or redis.call('HEXISTS', skey(sid), name) == 1
end
-- An entry's {session, token, kind, queue, the ms left to its session} if it is live (its
-- hash is there, and so is its session's key), else nil. (The session's PTTL, not EXISTS: one
-- call says both whether it is there and when a waiter behind it should look again.) On a
-- cluster the entry must also be owned, a field of that key: there a session lets its key in
-- a group expire once it holds nothing there, and makes it again when it next locks there; an
-- entry left from before (a release a failover undid) would live again with the new key, and
-- nobody would renew or release it.
local function live(name)
  local e = redis.call('HMGET', ekey(name), 's', 't', 'k', 'q')
  if not e[1] then return nil end
  if not owned(e[1], name) then return nil end
  local left = redis.call('PTTL', skey(e[1]))
  if left == -2 then return nil end
  e[5] = left
  return e
end
-- The queue path and the session of the entry named `name`, from the name alone (names follow
-- `key_value_entry_key`, read as layout.rs reads them: a read-write lock's leaf is
-- `{owner}_{attempt}` under `/read` or `/write`, its queue's path ends in `//rw`); nil for a
-- name that is no entry's.
local function entry_parts(name)
  local parent, leaf = string.match(name, '^(.+)/([^/]+)$')
  if not parent then return nil end
  local owner = string.match(leaf, '^([^_]+)_') or leaf
  if owner ~= leaf then
    local rw = string.match(parent, '^(.+)/read$') or string.match(parent, '^(.+)/write$')
    if rw then return rw .. '//rw', owner end
  end
  return parent, owner
end
-- Whether live entry `e` (named `name`) is still a member of its queue. Out of it (the
-- queue's key deleted by hand, or evicted) an entry holds nothing: the next acquirer finds the
-- queue empty, and is granted.
local function queued(name, e)
  return not e[4] or redis.call('ZSCORE', qkey(e[4]), name) ~= false
end
-- `live(name)` if it has token `token` (as text) and is still a member of its queue, else nil.
local function held(name, token)
  local e = live(name)
  if not e or e[2] ~= token or not queued(name, e) then return nil end
  return e
end
-- Deletes entry `name` of queue `path`, and wakes whoever waits on it: its owner and the
-- queue's observers (if it headed the queue) on their channels, and the entry right behind
-- it on its session's own channel ('NAME TOKEN head', or '... ahead' if something is still
-- ahead of it). If it headed the queue and the entry now at the head is live, its channel's
-- message names that entry and its token too ('gone NAME TOKEN', for a waiter subscribed to
-- it): its waiter is granted without reading the queue again (nothing can come ahead of it
-- later). The token, because names repeat (a session's entry in a mutex's queue has the same
-- name each time) and a message can arrive late (on a cluster it reaches the subscriber's node
-- over the cluster bus, after the script's reply, and may find a later wait of the same name):
-- only the entry it names, not a later one of the same name, may skip the read. `expired`: it
-- is dropped because its session's key (or its hash) expired, not by its owner. Behind
-- Sentinel, a grant that follows asks the sentinels first (on a primary demoted but not yet
-- reconfigured, entries expire because their owners moved on to the new one): the messages
-- that grant without a read say so ('NAME TOKEN expired', 'gone NAME TOKEN expired'), and the
-- queue is marked for `RECENT` ms, which the reads that decide a grant report (`recent`).
local function drop(path, name, expired)
  local q = qkey(path)
  local x = expired and xkey(path)
  -- The first two members: whether it heads the queue, and which entry heads it next.
  local first = redis.call('ZRANGE', q, '0', '1')
  local was_head = first[1] == name
  local after = first[2]
  local present = was_head
  if not was_head then
    -- The entry right behind it (rare: a cancelled or timed-out wait, a dead entry).
    local score = redis.call('ZSCORE', q, name)
    present = score ~= false
    after = score and redis.call('ZRANGEBYSCORE', q, '(' .. score, '+inf', 'LIMIT', '0', '1')[1]
  end
  -- Read before the first write: on a cluster whose slot is moving, a read of a key gone to
  -- the other node stops the script, and a script stopped after a write leaves it half done
  -- (the entry deleted and nobody woken; its retry then finds nothing to do).
  local e = after and live(after)
  redis.call('ZREM', q, name)
  redis.call('DEL', ekey(name))
  if x then redis.call('SET', x, '1', 'PX', RECENT) end
  local note = 'gone'
  if e then
    local word = 'ahead'
    if was_head then
      note = 'gone ' .. after .. ' ' .. e[2]
      word = 'head'
      if expired then
        note = note .. ' expired'
        word = 'expired'
      end
    end
    redis.call('PUBLISH', C .. ':w:' .. e[1], after .. ' ' .. e[2] .. ' ' .. word)
  end
  redis.call('PUBLISH', C .. ':c:' .. name, note)
  if was_head then redis.call('PUBLISH', C .. ':h:' .. path, 'gone') end
  return present
end
-- Drops what is left in its queue of our entry `name` whose hash is gone (deleted by hand,
-- evicted): its member would hold up the entry behind it until that one's next check
-- (seconds). A live entry always has its hash: a member without one is dead. Returns the
-- member's score (its token), if it was there.
local function drop_leftover(name)
  local path = entry_parts(name)
  local score = path and redis.call('ZSCORE', qkey(path), name)
  if score then drop(path, name) end
  return score
end
-- The version of what session `sid` owns in this group, or false if it has no key here.
local function version(sid)
  local v = redis.call('HGET', skey(sid), 'v')
  return v and tonumber(v)
end
-- Extends `key`'s expiry to at least `ttl` ms from now; never shortens it. Numbers the scripts
-- pass on stay the strings the client sent: Lua writes a number back with sprintf('%.14g'),
-- among the costliest steps of a script.
local function extend(key, ttl)
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and left < tonumber(ttl)) then redis.call('PEXPIRE', key, ttl) end
end
-- `extend` for a queue known to have an expiry (every script that makes a queue sets one): on
-- Redis 7 one call, `PEXPIRE GT` (which would take a key with no expiry for one that never
-- expires, and leave it so).
local function extend_expiring(key, ttl)
  if SEVEN then
    redis.call('PEXPIRE', key, ttl, 'GT')
  else
    extend(key, ttl)
  end
end
-- The `nearest` live entries of queue `path` before token `below` (a token as text: the
-- client's, or as `create` wrote it), only of kind `want` unless it is '', nearest first, as
-- {name, token, kind, ...} (tokens as text), and the ms left to the nearest's session (nil if
-- none). Dead entries met on the way are dropped. Reads only as far as it must: its cost
-- depends on `nearest`, not on the queue's length (any kind wanted: `nearest` members at first,
-- most often all it needs; else 16 at a time).
local function ahead(path, below, want, nearest)
  local q = qkey(path)
  local out, found, first = {}, 0, nil
  local cursor = '(' .. below
  local size = '16'
  if want == '' and nearest < 16 then size = tostring(nearest) end
  while found < nearest do
    local batch = redis.call('ZREVRANGEBYSCORE', q, cursor, '-inf', 'WITHSCORES', 'LIMIT', '0', size)
    if #batch == 0 then break end
    for i = 1, #batch, 2 do
      local name = batch[i]
      cursor = '(' .. batch[i + 1]
      local e = live(name)
      if not e then
        drop(path, name, true)
      elseif want == '' or e[3] == want then
        out[#out + 1] = name
        out[#out + 1] = e[2]
        out[#out + 1] = e[3]
        first = first or e[5]
        found = found + 1
        if found >= nearest then break end
      end
    end
    size = '16'
  end
  return out, first
end
-- Creates entry `name` of session `sid` (whose version is `v`) in queue `path` unless it
-- exists (`linger` its expiry in ms (see `lingering`), `created` the client's time in ms, both
-- as text; the caller sets the queue's expiry); returns its token as text, whether it was created, the session's
-- version after it (false if unchanged), and whether the queue was empty before it. The
-- session's key holds, besides its version `v`, a field per entry it owns in this group
-- (named by the entry; entry names have a '/', so never 'v'): one key, whose TTL is the
-- session's, for both. Every
-- change of what a session owns bumps its version (`v` of its key), which the client follows:
-- a version below the one the client has seen tells it that a failover lost changes. One
-- token counter for every namespace: two namespaces can name the same queue (`/svc` + `x`,
-- `` + `svc/x`), and its order must be one. (A retry that finds its entry spends a token
-- unused: tokens grow, not by one.)
local function create(sid, path, name, kind, value, linger, v, created, fresh)
  local q, e = qkey(path), ekey(name)
  local token = redis.call('INCR', K)
  -- The queue's last member: a new entry must score above every member, or it would queue
  -- ahead of them, and be granted beside the holder. A counter deleted by hand or evicted
  -- starts again from 1: the token is raised past the last score, and the counter with it.
  -- (An empty queue also tells the caller that the entry is alone in it.)
  local last = redis.call('ZRANGE', q, '-1', '-1', 'WITHSCORES')
  local raised = last[2] and tonumber(last[2]) >= token
  if raised then token = tonumber(last[2]) + 1 end
  -- Scores are doubles and Lua numbers too: past 2^53 tokens would lose their order. Checked
  -- before the counter is raised: an error undoes no write before it (a score written by
  -- hand must not leave the counter past the bound, or formatted past `%d`'s range).
  if token >= 9007199254740992 then
    error({err = 'ERR fencelock token counter exhausted (2^53)'})
  end
  if raised then redis.call('SET', K, string.format('%d', token)) end
  -- Numbers passed to Redis as '%d': Lua's own conversion ('%.14g') rounds from 10^14 up.
  local t = string.format('%d', token)
  if redis.call('ZADD', q, 'NX', t, name) == 0 then
    local owner = redis.call('HGET', e, 's')
    -- Ours, but maybe not made by an earlier try of this create: a leftover that must not
    -- come back to life with its old token and place (beside whoever its release granted
    -- the lock). So when the server lost changes of the session here (`fresh`: a release a
    -- failover undid brings its entry back), and, on a cluster, when the session's key does
    -- not list it (dead to every reader: see `live`). Dropped, and made anew: a real retry
    -- loses its place, no more (the client knows only the reply it gets).
    if owner == sid and (fresh or not owned(sid, name)) then
      -- (Not as expired: no session of it expired, and behind Sentinel that would have the
      -- next grants ask the sentinels first.)
      drop(path, name, false)
      owner = nil
    end
    if owner == sid then
      -- Found again (a retry). Touched, so that a WAIT that follows covers it.
      redis.call('PEXPIRE', e, linger)
      -- A score below 2^53 comes back as its digits ('%.17g'), as `t` was written.
      return redis.call('ZSCORE', q, name), 0, false, false
    end
    -- A member without its hash (evicted, or half deleted by hand), or that leftover: replaced
    -- (behind every member).
    redis.call('ZADD', q, t, name)
  end
  redis.call('HSET', e, 'q', path, 't', t, 's', sid, 'k', kind, 'c', created, 'v', value)
  redis.call('PEXPIRE', e, linger)
  v = v + 1
  redis.call('HSET', skey(sid), name, '1', 'v', string.format('%d', v))
  return t, 1, v, last[1] == nil
end
-- Tells the observers of queue `path` that a new entry heads it.
local function announce(path) redis.call('PUBLISH', C .. ':h:' .. path, 'new') end
-- Session `sid`'s version in this group, or false if it has no key here; with `open` = '1'
-- (its first use of the group: the client has no confirmed key here) the key is made if
-- missing, at version `known` (the highest the client has seen here, as text): a new key owns
-- nothing, so it is behind nothing.
local function enter(sid, open, ttl, known)
  local v = version(sid)
  -- A key there at the client's first use: left from a use of the group the client has let
  -- go of (on a cluster, the heartbeat stops renewing a group where nothing is held), with the
  -- expiry of its last renewal there, maybe before the next heartbeat: renewed now.
  if v and open == '1' then extend(skey(sid), ttl) end
  if v or open ~= '1' then return v end
  redis.call('HSET', skey(sid), 'v', known)
  redis.call('PEXPIRE', skey(sid), ttl)
  return tonumber(known)
end
-- 1 if version `v` is below `known` (the highest the client has seen): the server lost
-- changes of the session.
local function behind(v, known)
  if v < tonumber(known) then return 1 end
  return 0
end
