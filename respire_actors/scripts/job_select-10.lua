-- job_select: job_read for a scheduling-enabled worker: admit up to COUNT never-delivered jobs
-- to this consumer, ungrouped ready entries first, then one grouped job per group visit.
--
-- KEYS[1]  ready stream (consumer group ARGV[1] must exist)
-- KEYS[2]  control hash (queue pause flag and rate limit; see lib/fence.lua)
-- KEYS[3]  staging stream (:scheduled)
-- KEYS[4]  group rotation (:group-order)
-- KEYS[5]  staged grouped jobs (:group-jobs)
-- KEYS[6]  rotation cursor (:group-cursor)
-- KEYS[7]  group policy (:group-policy)
-- KEYS[8]  lease owners (:group-owners)
-- KEYS[9]  concurrency leases (:group-leases)
-- KEYS[10] parked groups (:group-parked)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  count: how many entries local capacity admits (1 .. 1000)
-- ARGV[4]  'ack' or 'delete' for expired entries (as job_read)
-- ARGV[5]  visibility timeout in ms (as job_read; 0 = none)
-- ARGV[6]  candidates per group visit (scheduling batch size, 1 .. 256)
-- ARGV[7]  most group visits this call may make (1 .. 10000)
--
-- Queue admission (pause, then the queue-wide rate limit) runs first, exactly as job_read: a
-- denial returns before anything changes, so staged jobs and the cursor stay as they were.
-- Unread ready entries (immediate jobs, promoted ungrouped jobs) are read first (FIFO
-- precedence). Permits left over go to group visits: a bounded wake pass (at most ARGV[7]
-- groups) returns parked groups whose deadline passed to the rotation; then each visit takes the next group after the cursor
-- in byte order (wrapping) and moves the cursor to it. A paused, concurrency-limited or
-- GCRA-limited group is parked (outside the rotation, with its reason and wake deadline);
-- a group with no due member (delayed) dispatches nothing and is parked until its earliest due
-- time; otherwise the highest priority
-- among the group's oldest ARGV[6] due members is taken (due time, then staging id, break
-- ties). A missing or expired candidate is removed and consumes the turn. The chosen job is
-- appended to the ready stream, read into this consumer's pending list (XREADGROUP: it is the
-- only unread entry), removed from staging, given a concurrency lease owned by this consumer
-- and attempt 1, and charged to the group's GCRA. Visits stop when the permits are used, a
-- whole lap of the rotation dispatched nothing, or ARGV[7] visits were made.
-- Returns as job_read: {'paused'}; {'limited', retry_after_ms}; {'recover', id, pace_ms};
-- {'ok', entries, expired_count, pace_ms, visits} (entries may be empty when the visit budget
-- ran out: read again); {'empty', last_ready_id, last_staged_id, wake_ms} where wake_ms is how
-- long until a delayed or parked group may have work (-1: nothing known).
-- Errors: NOGROUP; RESPIRE_ARGUMENT; RESPIRE_WRONGTYPE / RESPIRE_NOPERM before any write;
-- RESPIRE_SELECT when delivering a selected job still fails (its append is undone and it stays
-- staged; selections made earlier in the call stay delivered and are recovered as pending).
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/group_lease.lua

local ready, control, scheduled = KEYS[1], KEYS[2], KEYS[3]
local order, jobs, cursor_key = KEYS[4], KEYS[5], KEYS[6]
local policy, owners, leases, parked = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local group, consumer = ARGV[1], ARGV[2]
local count, mode, min_idle = respire_read_args(ready, group, ARGV[3], ARGV[4], ARGV[5])
if not count then return mode end
local batch, max_visits = tonumber(ARGV[6]), tonumber(ARGV[7])
if not batch or batch < 1 or batch > 256 or batch % 1 ~= 0 or not max_visits
   or max_visits < 1 or max_visits > 10000 or max_visits % 1 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT bad batch size or visit budget')
end
local early, allowed, pace, window = respire_read_admission(ready, control, group, count,
                                                             min_idle)
if early then return early end
local probes = respire_admit_probes(respire_ack_probes({}, ready, group, mode), control, window)
probes[#probes + 1] = {'XADD', ready, '*', 'f', 'v'}
probes[#probes + 1] = {'XDEL', scheduled, '0-1'}
probes[#probes + 1] = {'ZADD', order, '0', 'm'}
probes[#probes + 1] = {'ZREM', order, 'm'}
probes[#probes + 1] = {'ZREM', jobs, 'm'}
probes[#probes + 1] = {'SET', cursor_key, 'v'}
probes[#probes + 1] = {'HSET', policy, 'f', 'v'}
probes[#probes + 1] = {'HDEL', policy, 'f'}
probes[#probes + 1] = {'HINCRBY', policy, 'f', '1'}
probes[#probes + 1] = {'ZREM', parked, 'm'}
if min_idle > 0 then probes[#probes + 1] = {'HSET', control, 'lease.ms', '0'} end
-- the reads after the first delivery was written: TIME (expiries) always; the group visits'
-- only when there are groups to visit (the visits, and their reads, run only then)
probes[#probes + 1] = {'TIME'}
probes[#probes + 1] = {'XREADGROUP', 'GROUP', group, consumer, 'COUNT', '1', 'STREAMS', ready, '>'}
local groups_present = redis.call('EXISTS', order, parked) > 0
if groups_present then
  respire_fence_probes(probes, ready, false)
  probes[#probes + 1] = {'XRANGE', scheduled, '-', '+', 'COUNT', '1'}
  probes[#probes + 1] = {'XREVRANGE', ready, '+', '-', 'COUNT', '1'}
  probes[#probes + 1] = {'XREVRANGE', scheduled, '+', '-', 'COUNT', '1'}
  probes[#probes + 1] = {'EXISTS', ready}
  probes[#probes + 1] = {'EXISTS', order}
  probes[#probes + 1] = {'GET', cursor_key}
  probes[#probes + 1] = {'HGET', policy, 'f'}
  probes[#probes + 1] = {'HEXISTS', policy, 'f'}
  probes[#probes + 1] = {'ZRANGEBYLEX', jobs, '-', '+'}
  probes[#probes + 1] = {'ZRANGEBYLEX', order, '-', '+'}
  probes[#probes + 1] = {'ZRANGE', parked, '0', '0'}
  probes[#probes + 1] = {'ZRANGEBYSCORE', parked, '-inf', '+inf'}
end
local err = respire_preflight(
  {{ready, 'stream'}, {scheduled, 'stream'}, {order, 'zset'}, {jobs, 'zset'},
   {cursor_key, 'string'}, {policy, 'hash'}, {owners, 'hash'}, {leases, 'zset'},
   {parked, 'zset'}, {control, 'hash'}},
  respire_lease_probes(probes, leases, owners, parked))
if err then return err end
-- the reader's visibility timeout, recorded before anything is delivered (lib/fence.lua)
respire_lease_record(control, min_idle)

local now_ms = nil
local function now()
  if not now_ms then now_ms = respire_now_ms() end
  return now_ms
end
local live, expired, read = {}, 0, 0
local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', allowed,
                         'STREAMS', ready, '>')
if reply and reply[1] then
  for _, entry in ipairs(reply[1][2]) do
    read = read + 1
    if entry[2] and respire_expired(entry[2], now) then
      respire_ack(ready, group, mode, entry[1])
      expired = expired + 1
    else
      live[#live + 1] = entry
    end
  end
end

local wake = -1
local function hint(at)
  local d = at - now()
  if d < 1 then d = 1 end
  if wake < 0 or d < wake then wake = d end
end

-- One visit of group g: returns the delivered entry, or nil.
local function visit(g, t)
  local p = respire_group_policy(policy, g)
  local reason, extra = respire_group_check(p, policy, leases, owners, g, t, nil)
  if reason then
    respire_park(order, parked, policy, g, reason, extra)
    if reason ~= 'paused' then hint(extra) end
    return nil
  end
  local genc = respire_genc(g)
  local lo, hi = respire_grange(g)
  -- Only when some staged job of the group has a nonzero priority can a later candidate beat
  -- the oldest due one: otherwise the visit reads a single member.
  local prioritized = redis.call('HEXISTS', policy, 'q' .. g) == 1
  local members = redis.call('ZRANGEBYLEX', jobs, lo, hi, 'LIMIT', 0, prioritized and batch or 1)
  if #members == 0 then
    redis.call('ZREM', order, g)  -- empty groups leave the rotation
    return nil
  end
  local best = nil
  for _, m in ipairs(members) do
    local due, id, prio = respire_parse_job_member(genc, m)
    if due > t then
      if not best then
        -- a delayed group consumes the visit and waits outside the rotation until it is due,
        -- so idle readers do not rescan groups that only hold future jobs
        respire_park(order, parked, policy, g, 'delayed', due)
        hint(due)
      end
      break
    end
    if not best or prio > best.prio then best = {m = m, id = id, prio = prio} end
  end
  if not best then return nil end
  local fields = respire_entry(scheduled, best.id)
  local delivered = nil
  if fields and not respire_expired(fields, now) then
    local new_id = redis.call('XADD', ready, '*', unpack(fields))
    -- Unread entries were drained above, so the new entry is the only one XREADGROUP can
    -- return. Should delivery or the lease still fail, the append is undone and the job stays
    -- staged, untouched.
    local ok, got = pcall(redis.call, 'XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1,
                          'STREAMS', ready, '>')
    local problem = nil
    if not ok then
      problem = tostring(got)
    else
      delivered = got and got[1] and got[1][2][1]
      if not delivered or delivered[1] ~= new_id then
        problem = 'another unread entry preceded ' .. new_id
      else
        local took, terr = pcall(respire_group_take, policy, leases, owners, g, new_id, consumer,
                                 1, t, p, extra)
        if not took then problem = tostring(terr) end
      end
    end
    if problem then
      pcall(redis.call, 'XACK', ready, group, new_id)
      redis.call('XDEL', ready, new_id)
      pcall(respire_group_drop, leases, owners, g, new_id)
      return redis.error_reply('RESPIRE_SELECT delivering a grouped job failed: ' .. problem)
    end
  end
  redis.call('ZREM', jobs, best.m)
  respire_prio_count(policy, g, best.prio, -1)
  if fields then redis.call('XDEL', scheduled, best.id) end
  if not respire_group_has_jobs(jobs, g) then redis.call('ZREM', order, g) end
  return delivered
end

local visits = 0
local exhausted = false
local remaining = allowed - read
if remaining > 0 and groups_present then
  local t = now()
  respire_wake(order, jobs, parked, policy, t, max_visits)
  local cursor = redis.call('GET', cursor_key)
  local lap = {}
  local selected = 0
  while selected < remaining do
    if visits >= max_visits then
      exhausted = true
      break
    end
    local nxt = nil
    if cursor then
      nxt = redis.call('ZRANGEBYLEX', order, '(' .. cursor, '+', 'LIMIT', 0, 1)[1]
    end
    if not nxt then nxt = redis.call('ZRANGEBYLEX', order, '-', '+', 'LIMIT', 0, 1)[1] end
    if not nxt or lap[nxt] then break end  -- nothing staged, or a whole lap found nothing
    lap[nxt] = true
    visits = visits + 1
    cursor = nxt
    local entry = visit(nxt, t)
    if type(entry) == 'table' and entry.err then return entry end
    if entry then
      live[#live + 1] = entry
      selected = selected + 1
      lap = {}
    end
  end
  if visits > 0 then redis.call('SET', cursor_key, cursor) end
  local first = redis.call('ZRANGE', parked, 0, 0, 'WITHSCORES')
  if first[2] and tonumber(first[2]) < RESPIRE_PAUSED_SCORE then hint(tonumber(first[2])) end
end
respire_admit_commit(control, window, #live)
if read > 0 or #live > 0 or exhausted then return {'ok', live, expired, pace, visits} end
local last = redis.call('XREVRANGE', ready, '+', '-', 'COUNT', 1)
local staged = redis.call('XREVRANGE', scheduled, '+', '-', 'COUNT', 1)
local last_id, staged_id = '0-0', '0-0'
if last[1] then last_id = last[1][1] end
if staged[1] then staged_id = staged[1][1] end
return {'empty', last_id, staged_id, wake}
