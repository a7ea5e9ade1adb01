-- job_group_admin: application group controls and inspection.
--
-- KEYS[1]  group policy (:group-policy)
-- KEYS[2]  group rotation (:group-order)
-- KEYS[3]  staged grouped jobs (:group-jobs)
-- KEYS[4]  parked groups (:group-parked)
-- KEYS[5]  concurrency leases (:group-leases)
-- KEYS[6]  lease owners (:group-owners)
-- ARGV[1]  operation: 'set' | 'pause' | 'resume' | 'get' | 'list'
-- ARGV[2]  the group ('list': the cursor, '' to start: groups after it in byte order)
-- ARGV[3..] 'set': max concurrency, permit limit, window ms, lease ms ('' = unlimited for the
--          first three; lease 100 .. 2^31-1); 'list': page size (1 .. 1000)
--
-- 'set' replaces the group's limits (its pause state is kept) and wakes it if it is parked for
-- a limit; 'pause' sets the pause flag and parks the group (new deliveries and recovery
-- admissions stop; running handlers are not touched); 'resume' clears it and returns the group
-- to the rotation when it has staged jobs. Pausing or resuming does not touch the queue's pause.
-- Returns 'set' / 'pause' / 'resume': 1 when the stored state changed, else 0. 'get':
-- {policy or '', paused 0|1, staged, due, running, parked reason or '', parked deadline or -1,
-- known 0|1}. 'list': {next_cursor or '', {group, <the 'get' reply>}...}, the page covering
-- groups in the rotation or parked (at most 10000 parked groups are considered; idle groups
-- that only have a policy: use 'get').
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM before any write.
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/group_lease.lua

local policy, order, jobs, parked, leases, owners =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op, g = ARGV[1], ARGV[2]
local max = 2147483647
local function int_or_empty(v, lo)
  if v == '' then return true end
  local n = tonumber(v)
  return n ~= nil and n >= lo and n <= max and n % 1 == 0
end
if op == 'set' then
  if not g or g == '' or #ARGV ~= 6 or not int_or_empty(ARGV[3], 1)
     or not int_or_empty(ARGV[4], 1) or not int_or_empty(ARGV[5], 1)
     or (ARGV[4] == '') ~= (ARGV[5] == '') or not tonumber(ARGV[6])
     or tonumber(ARGV[6]) < 100 or tonumber(ARGV[6]) > max then
    return redis.error_reply('RESPIRE_ARGUMENT bad group options')
  end
elseif op == 'pause' or op == 'resume' or op == 'get' then
  if not g or g == '' then return redis.error_reply('RESPIRE_ARGUMENT empty group') end
elseif op == 'list' then
  local n = tonumber(ARGV[3] or '')
  if not g or not n or n < 1 or n > 1000 or n % 1 ~= 0 then
    return redis.error_reply('RESPIRE_ARGUMENT bad page')
  end
else
  return redis.error_reply('RESPIRE_ARGUMENT unknown operation')
end
local err = respire_preflight(
  {{policy, 'hash'}, {order, 'zset'}, {jobs, 'zset'}, {parked, 'zset'}, {leases, 'zset'},
   {owners, 'hash'}},
  -- the reads 'set' and 'resume' make after their first write (is the group parked, has it
  -- staged jobs) are checked here too: a refusal there would leave the policy half-changed
  (op == 'set' or op == 'pause' or op == 'resume') and
    {{'HSET', policy, 'f', 'v'}, {'HDEL', policy, 'f'}, {'ZADD', order, '0', 'm'},
     {'ZREM', order, 'm'}, {'ZADD', parked, '0', 'm'}, {'ZREM', parked, 'm'},
     {'ZSCORE', parked, 'm'}, {'ZRANGEBYLEX', jobs, '-', '+'}, {'HGET', policy, 'f'}} or
  -- 'get' and 'list' read only: name a refused read rather than fail on it unnamed
    {{'HGET', policy, 'f'}, {'TIME'}, {'ZLEXCOUNT', jobs, '-', '+'},
     {'ZRANGEBYLEX', leases, '-', '+'}, {'ZSCORE', parked, 'm'}, {'HGET', owners, 'f'},
     {'ZRANGEBYLEX', order, '-', '+'}, {'ZRANGE', parked, '0', '0'}})
if err then return err end

local function store(p)
  local v = (p.max and string.format('%d', p.max) or '') .. '|' ..
            (p.limit and string.format('%d', p.limit) or '') .. '|' ..
            (p.window and string.format('%d', p.window) or '') .. '|' ..
            string.format('%d', p.lease) .. '|' .. (p.paused and '1' or '')
  redis.call('HSET', policy, 'p' .. g, v)
  return v
end

local function info(name)
  local p, raw = respire_group_policy(policy, name)
  local now = respire_now_ms()
  local genc = respire_genc(name)
  local lo, hi = respire_grange(name)
  local staged = redis.call('ZLEXCOUNT', jobs, lo, hi)
  local due = redis.call('ZLEXCOUNT', jobs, lo, '(' .. genc .. string.format('%015d', now + 1))
  local running = 0
  for _, m in ipairs(redis.call('ZRANGEBYLEX', leases, lo, hi)) do
    local o = respire_lease_owner(owners, m)
    if o and o.expiry > now then running = running + 1 end
  end
  local score = redis.call('ZSCORE', parked, name)
  local reason, deadline = '', -1
  if score then
    reason = redis.call('HGET', policy, 'k' .. name) or ''
    if p.paused then reason = 'paused' end
    deadline = tonumber(score)
    if deadline >= RESPIRE_PAUSED_SCORE then deadline = -1 end
  end
  local known = (raw or staged > 0 or running > 0 or score) and 1 or 0
  return {raw or '', p.paused and 1 or 0, staged, due, running, reason, deadline, known}
end

if op == 'set' then
  local p, raw = respire_group_policy(policy, g)
  p.max = tonumber(ARGV[3])
  p.limit = tonumber(ARGV[4])
  p.window = tonumber(ARGV[5])
  p.lease = tonumber(ARGV[6])
  local v = store(p)
  if not p.paused and redis.call('ZSCORE', parked, g) then
    respire_unpark(order, jobs, parked, policy, g)  -- a policy change wakes a parked group
  end
  if v == raw then return 0 end
  return 1
elseif op == 'pause' then
  local p = respire_group_policy(policy, g)
  if p.paused then return 0 end
  p.paused = true
  store(p)
  respire_park(order, parked, policy, g, 'paused', RESPIRE_PAUSED_SCORE)
  return 1
elseif op == 'resume' then
  local p = respire_group_policy(policy, g)
  if not p.paused then return 0 end
  p.paused = false
  store(p)
  respire_unpark(order, jobs, parked, policy, g)
  return 1
elseif op == 'get' then
  return info(g)
end
-- list: merge the two lexically ordered sets after the cursor
local n = tonumber(ARGV[3])
local lo = '-'
if g ~= '' then lo = '(' .. g end
local a = redis.call('ZRANGEBYLEX', order, lo, '+', 'LIMIT', 0, n)
-- :group-parked is scored by deadline, so it has no lexical order: take up to 10000 members
-- and filter them here (documented bound of the listing).
local b = {}
for _, x in ipairs(redis.call('ZRANGE', parked, 0, 9999)) do
  if g == '' or x > g then b[#b + 1] = x end
end
local names, seen = {}, {}
for _, x in ipairs(a) do if not seen[x] then seen[x] = true; names[#names + 1] = x end end
for _, x in ipairs(b) do if not seen[x] then seen[x] = true; names[#names + 1] = x end end
table.sort(names)
local page, next_cursor = {}, ''
for i = 1, math.min(n, #names) do
  page[#page + 1] = {names[i], info(names[i])}
end
if #names > n or #a == n then next_cursor = names[math.min(n, #names)] end
return {next_cursor, page}
