-- Application groups (job groups): encoding, policy, concurrency leases, GCRA and parking.
--
-- A group's text never appears in a key. Inside members and fields it is encoded as
-- respire_genc(g): 8 hex digits of its byte length, then its bytes. That code is prefix-free, so
-- all members of one group are contiguous in a lexicographically ordered set and no other
-- group's member sorts among them (braces, separators and NUL bytes are harmless).
--
-- :group-order   zset (score 0): groups in the active rotation (staged jobs, not parked)
-- :group-jobs    zset (score 0): genc .. due (15 digits, unix ms) .. ':' .. staging id
--                (respire_id_sortable: fixed width) .. ':' .. priority, so a group's members
--                are ordered by due time, then staging id as a stream id. Members written
--                before the padding (staging id as is) still parse.
-- :group-cursor  string: the last group visited
-- :group-policy  hash: 'p' .. group -> 'max|limit|window|lease|paused' ('' = unlimited);
--                't' .. group -> GCRA theoretical arrival time (ms); 'k' .. group -> why parked;
--                'q' .. group -> how many of its staged jobs have a nonzero priority (while 0,
--                a visit only needs the group's oldest due member)
-- :group-leases  zset (score 0): genc .. entry id, one per admitted grouped delivery
-- :group-owners  hash: the same member -> attempt .. ':' .. expiry ms .. ':' .. consumer
-- :group-parked  zset: parked groups (paused, at their concurrency limit, out of GCRA permits,
--                or delayed: nothing due yet) scored by their wake deadline
--                (RESPIRE_PAUSED_SCORE while paused: only resume wakes them)
--!include lib/stream_id.lua

local RESPIRE_PAUSED_SCORE = 9007199254740991
local RESPIRE_DEFAULT_LEASE = 60000

local function respire_genc(g)
  return string.format('%08x', #g) .. g
end

-- The member range bounds of one group's members (':' sorts after every digit).
local function respire_grange(g)
  local genc = respire_genc(g)
  return '[' .. genc, '(' .. genc .. ':'
end

local function respire_job_member(g, due, id, priority)
  return respire_genc(g) .. string.format('%015d', due) .. ':' .. respire_id_sortable(id) ..
         ':' .. string.format('%d', priority)
end

-- Parses a :group-jobs member of group encoding `genc` into due, staging id and priority.
local function respire_parse_job_member(genc, m)
  local due = tonumber(string.sub(m, #genc + 1, #genc + 15))
  local rest = string.sub(m, #genc + 17)
  local colon = string.find(rest, ':', 1, true)
  return due, respire_id_unsortable(string.sub(rest, 1, colon - 1)),
         tonumber(string.sub(rest, colon + 1)) or 0
end

-- The group's policy: {max, limit, window, lease, paused}; nil limits mean unlimited.
-- Counts a staged member of g with a nonzero priority in or out (delta +1 / -1).
local function respire_prio_count(policy, g, priority, delta)
  if priority ~= 0 then
    if redis.call('HINCRBY', policy, 'q' .. g, delta) <= 0 then
      redis.call('HDEL', policy, 'q' .. g)
    end
  end
end

local function respire_group_policy(policy, g)
  local raw = redis.call('HGET', policy, 'p' .. g)
  local p = {max = nil, limit = nil, window = nil, lease = RESPIRE_DEFAULT_LEASE, paused = false}
  if raw then
    local parts = {}
    for v in string.gmatch(raw .. '|', '([^|]*)|') do parts[#parts + 1] = v end
    p.max = tonumber(parts[1] or '')
    p.limit = tonumber(parts[2] or '')
    p.window = tonumber(parts[3] or '')
    p.lease = tonumber(parts[4] or '') or RESPIRE_DEFAULT_LEASE
    p.paused = parts[5] == '1'
  end
  return p, raw
end

local function respire_group_has_jobs(jobs, g)
  local lo, hi = respire_grange(g)
  return #redis.call('ZRANGEBYLEX', jobs, lo, hi, 'LIMIT', 0, 1) > 0
end

local function respire_lease_owner(owners, member)
  local v = redis.call('HGET', owners, member)
  if not v then return nil end
  local a, e, c = string.match(v, '^(%d+):(%d+):(.*)$')
  if not a then return nil end
  return {attempt = tonumber(a), expiry = tonumber(e), consumer = c}
end

-- Live leases of g at `now`, removing expired ones (a crashed worker's permit frees itself at
-- expiry). Returns the live count, the earliest live expiry and whether `entry` holds one.
local function respire_group_running(leases, owners, g, now, entry)
  local genc = respire_genc(g)
  local lo, hi = respire_grange(g)
  local live, earliest, holds = 0, nil, false
  for _, m in ipairs(redis.call('ZRANGEBYLEX', leases, lo, hi)) do
    local o = respire_lease_owner(owners, m)
    if not o or o.expiry <= now then
      redis.call('ZREM', leases, m)
      redis.call('HDEL', owners, m)
    else
      live = live + 1
      if not earliest or o.expiry < earliest then earliest = o.expiry end
      if entry and m == genc .. entry then holds = true end
    end
  end
  return live, earliest, holds
end

-- Whether group g (policy p) may admit one delivery at `now` (entry: the pending entry being
-- recovered, whose own old lease does not count). Returns nil, tat (the GCRA state to commit,
-- nil without a rate policy) to admit, or a reason ('paused' | 'concurrency' | 'rate') and the
-- deadline at which the group may become eligible again. Its only writes remove expired leases.
local function respire_group_check(p, policy, leases, owners, g, now, entry)
  if p.paused then return 'paused', RESPIRE_PAUSED_SCORE end
  if p.max then
    local lo, hi = respire_grange(g)
    if redis.call('ZLEXCOUNT', leases, lo, hi) >= p.max then
      local live, earliest, holds = respire_group_running(leases, owners, g, now, entry)
      if holds then live = live - 1 end
      if live >= p.max then return 'concurrency', earliest or now end
    end
  end
  if p.limit and p.window then
    -- GCRA: burst = limit, one permit replenished every ceil(window / limit) ms.
    local t = math.ceil(p.window / p.limit)
    local tat = tonumber(redis.call('HGET', policy, 't' .. g) or '') or 0
    if tat < now then tat = now end
    if tat - now > t * (p.limit - 1) then return 'rate', tat - t * (p.limit - 1) end
    return nil, tat + t
  end
  return nil, nil
end

-- Records one admission of `entry` (attempt `attempt`, owned by `consumer`): the GCRA state
-- and the concurrency lease, which replaces any older lease of the same entry.
local function respire_group_take(policy, leases, owners, g, entry, consumer, attempt, now, p, tat)
  if tat then redis.call('HSET', policy, 't' .. g, string.format('%d', tat)) end
  local m = respire_genc(g) .. entry
  redis.call('ZADD', leases, 0, m)
  redis.call('HSET', owners, m, string.format('%d:%d:', attempt, now + p.lease) .. consumer)
end

-- Drops the lease of `entry` whoever owns it (the entry itself is finished: dead-lettered or
-- expired by recovery).
local function respire_group_drop(leases, owners, g, entry)
  local m = respire_genc(g) .. entry
  redis.call('ZREM', leases, m)
  redis.call('HDEL', owners, m)
end

-- A parked group becomes due at once (the next read's wake pass returns it to the rotation),
-- unless it is paused.
local function respire_group_nudge(parked, g)
  local s = redis.call('ZSCORE', parked, g)
  if s and tonumber(s) < RESPIRE_PAUSED_SCORE then redis.call('ZADD', parked, 0, g) end
end

-- Releases the lease of `entry` when `consumer` holds it for `attempt` (a stale release of a
-- replaced attempt frees nothing) and nudges the group if it is parked. Returns 1 or 0.
local function respire_group_release(leases, owners, parked, g, entry, consumer, attempt)
  local m = respire_genc(g) .. entry
  local o = respire_lease_owner(owners, m)
  if not o or o.consumer ~= consumer or o.attempt ~= tonumber(attempt) then return 0 end
  redis.call('ZREM', leases, m)
  redis.call('HDEL', owners, m)
  respire_group_nudge(parked, g)
  return 1
end

-- The renewer's contract: extends the lease of `entry` to now_ms + lease_ms when `consumer`
-- still holds it for `attempt`. Returns 1 (renewed) or 0 (lost: released, replaced by another
-- owner or attempt, or expired and taken by an admission check).
local function group_lease_renew(leases, owners, group, entry_id, consumer, attempt, now_ms,
                                 lease_ms)
  local m = respire_genc(group) .. entry_id
  local o = respire_lease_owner(owners, m)
  if not o or o.consumer ~= consumer or o.attempt ~= tonumber(attempt) then return 0 end
  redis.call('HSET', owners, m, string.format('%d:%d:', o.attempt, now_ms + lease_ms) .. consumer)
  redis.call('ZADD', leases, 0, m)
  return 1
end

-- A job of g staged or retried due at `due`: g joins the rotation, unless it is parked; a parked
-- group (not paused) is woken no later than the new job's due time.
local function respire_group_staged(order, parked, g, due)
  local s = redis.call('ZSCORE', parked, g)
  if not s then
    redis.call('ZADD', order, 0, g)
  elseif tonumber(s) < RESPIRE_PAUSED_SCORE and due < tonumber(s) then
    redis.call('ZADD', parked, string.format('%d', due), g)
  end
end

local function respire_park(order, parked, policy, g, reason, deadline)
  redis.call('ZREM', order, g)
  redis.call('ZADD', parked, string.format('%d', deadline), g)
  redis.call('HSET', policy, 'k' .. g, reason)
end

local function respire_unpark(order, jobs, parked, policy, g)
  redis.call('ZREM', parked, g)
  redis.call('HDEL', policy, 'k' .. g)
  if respire_group_has_jobs(jobs, g) then redis.call('ZADD', order, 0, g) end
end

-- A bounded wake pass: at most n parked groups whose deadline passed rejoin the rotation.
local function respire_wake(order, jobs, parked, policy, now, n)
  local due = redis.call('ZRANGEBYSCORE', parked, '-inf', now, 'LIMIT', 0, n)
  for _, g in ipairs(due) do respire_unpark(order, jobs, parked, policy, g) end
  return #due
end

-- ACL probes of the lease writes (release, take).
local function respire_lease_probes(probes, leases, owners, parked)
  probes[#probes + 1] = {'ZADD', leases, '0', 'm'}
  probes[#probes + 1] = {'ZREM', leases, 'm'}
  probes[#probes + 1] = {'HSET', owners, 'f', 'v'}
  probes[#probes + 1] = {'HDEL', owners, 'f'}
  -- the reads of a lease check, repeated between the writes of a batch of outcomes or visits
  probes[#probes + 1] = {'HGET', owners, 'f'}
  probes[#probes + 1] = {'ZRANGEBYLEX', leases, '-', '+'}
  probes[#probes + 1] = {'ZLEXCOUNT', leases, '-', '+'}
  if parked then
    probes[#probes + 1] = {'ZADD', parked, '0', 'm'}
    -- releasing a lease nudges a parked group: a read after the lease's ZREM/HDEL
    probes[#probes + 1] = {'ZSCORE', parked, 'm'}
  end
  return probes
end
