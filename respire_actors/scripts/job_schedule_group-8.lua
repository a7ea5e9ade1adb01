-- job_schedule_group: stage a job of an application group unless its id was enqueued within the
-- deduplication window (shared with job_enqueue and job_schedule; deduplication is queue-wide).
--
-- KEYS[1]  staging stream (:scheduled)
-- KEYS[2]  deduplication key of this job id (string: the winning entry id)
-- KEYS[3]  staged grouped jobs (:group-jobs, see lib/group_lease.lua)
-- KEYS[4]  group rotation (:group-order)
-- KEYS[5]  parked groups (:group-parked)
-- KEYS[6]  group policy (:group-policy; counts staged jobs with a nonzero priority)
-- KEYS[7]  control hash (its max_backlog field is the optional backlog bound)
-- KEYS[8]  ready stream (counted in the backlog)
-- ARGV[1]  deduplication window in milliseconds (1 .. 2^31-1)
-- ARGV[2]  delay in milliseconds (0 .. 2^31-1), counted from the server clock (TIME)
-- ARGV[3]  priority (integer, -2^31 .. 2^31-1; higher is selected first within a group visit)
-- ARGV[4]  time to live in milliseconds (1 .. 2^31-1), or 0 for none
-- ARGV[5]  the application group (nonblank; stored in _respire.job.group, never in a key)
-- ARGV[6..] field/value pairs of the envelope (job id, payload, trace context, ...)
--
-- The staged entry gets _respire.job.group, _respire.job.priority and, with a TTL,
-- _respire.job.expires_at. It is indexed in :group-jobs (not in :due: grouped jobs are only
-- selected by a reader, one per group visit) and the group joins the rotation at its lexical
-- position unless it is parked (a parked group that is not paused is woken no later than the
-- new job's due time).
-- Returns {staging_id, 1} for a new job, {original_entry_id, 0} for a duplicate (nothing
-- written).
-- Errors: RESPIRE_FULL (the backlog bound is reached, see lib/backlog.lua; nothing written),
-- RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written); if indexing or
-- recording the deduplication key fails after the append, the append is undone first
-- (RESPIRE_SCHEDULE / RESPIRE_DEDUP).
--!include lib/preflight.lua
--!include lib/backlog.lua
--!include lib/fence.lua
--!include lib/group_lease.lua

local scheduled, dedup, jobs, order, parked = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local policy, control, ready = KEYS[6], KEYS[7], KEYS[8]
local window, delay = tonumber(ARGV[1]), tonumber(ARGV[2])
local priority, ttl, g = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local arg_err = respire_check_schedule_args(window, delay, priority, ttl)
if arg_err then return arg_err end
if not g or g == '' then
  return redis.error_reply('RESPIRE_ARGUMENT the group must not be empty')
end
local perm_err = respire_expect_perm('GET', dedup)  -- named, before any write
if perm_err then return perm_err end
local existing = redis.call('GET', dedup)
if existing then return {existing, 0} end
local err = respire_backlog_refusal(control, ready, scheduled, 1)
if err then return err end
err = respire_preflight(
  {{scheduled, 'stream'}, {dedup, 'string'}, {jobs, 'zset'}, {order, 'zset'}, {parked, 'zset'},
   {policy, 'hash'}},
  {{'XADD', scheduled, '*', 'f', 'v'}, {'XDEL', scheduled, '0-1'}, {'ZADD', jobs, '0', 'm'},
   {'ZREM', jobs, 'm'}, {'ZADD', order, '0', 'm'}, {'SET', dedup, 'v', 'PX', '1'},
   {'HINCRBY', policy, 'f', '1'}, {'HDEL', policy, 'f'}, {'ZADD', parked, '0', 'm'},
   {'ZSCORE', parked, 'm'}, {'TIME'}})  -- ZSCORE runs after the XADD (is the group parked?)
if err then return err end
local now = respire_now_ms()
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
fields[#fields + 1] = '_respire.job.group'
fields[#fields + 1] = g
fields[#fields + 1] = '_respire.job.priority'
fields[#fields + 1] = string.format('%d', priority)
if ttl > 0 then
  fields[#fields + 1] = '_respire.job.expires_at'
  fields[#fields + 1] = string.format('%d', now + ttl)
end
local id = redis.call('XADD', scheduled, '*', unpack(fields))
local member = respire_job_member(g, now + delay, id, priority)
local ok, zErr = pcall(function()
  redis.call('ZADD', jobs, 0, member)
  respire_group_staged(order, parked, g, now + delay)
end)
if not ok then
  redis.call('ZREM', jobs, member)
  redis.call('XDEL', scheduled, id)
  return redis.error_reply('RESPIRE_SCHEDULE indexing the staged job failed: ' .. tostring(zErr))
end
local set_ok, setErr = pcall(redis.call, 'SET', dedup, id, 'PX', window)
if not set_ok then
  redis.call('ZREM', jobs, member)
  redis.call('XDEL', scheduled, id)
  return redis.error_reply('RESPIRE_DEDUP recording the deduplication key failed: ' .. tostring(setErr))
end
respire_prio_count(policy, g, priority, 1)
return {id, 1}
