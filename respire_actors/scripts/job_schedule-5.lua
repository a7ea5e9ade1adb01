-- job_schedule: stage a delayed / prioritised / expiring job unless its id was enqueued within
-- the deduplication window (shared with job_enqueue).
--
-- KEYS[1]  staging stream (:scheduled)
-- KEYS[2]  due-time index (:due, sorted set: staging id scored by due time in unix ms)
-- KEYS[3]  deduplication key of this job id (string: the winning entry id)
-- KEYS[4]  control hash (its max_backlog field is the optional backlog bound)
-- KEYS[5]  ready stream (counted in the backlog)
-- ARGV[1]  deduplication window in milliseconds (1 .. 2^31-1)
-- ARGV[2]  delay in milliseconds (0 .. 2^31-1), counted from the server clock (TIME)
-- ARGV[3]  priority (integer, -2^31 .. 2^31-1; higher is promoted first within a batch)
-- ARGV[4]  time to live in milliseconds (1 .. 2^31-1), or 0 for none
-- ARGV[5..] field/value pairs of the envelope (job id, payload, trace context, ...)
--
-- The staged entry gets _respire.job.priority and, with a TTL, _respire.job.expires_at
-- (server time + TTL, absolute unix ms).
-- Returns {staging_id, 1} for a new job, {original_entry_id, 0} for a duplicate (a staged or
-- ready id; nothing written).
-- Errors: RESPIRE_FULL (the backlog bound is reached, see lib/backlog.lua; nothing written),
-- RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written); if indexing or
-- recording the deduplication key fails after the append, the append is undone first
-- (RESPIRE_SCHEDULE / RESPIRE_DEDUP).
--!include lib/preflight.lua
--!include lib/backlog.lua
--!include lib/fence.lua

local scheduled, due, dedup, control, ready = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local window, delay = tonumber(ARGV[1]), tonumber(ARGV[2])
local priority, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local arg_err = respire_check_schedule_args(window, delay, priority, ttl)
if arg_err then return arg_err end
local perm_err = respire_expect_perm('GET', dedup)  -- named, before any write
if perm_err then return perm_err end
local existing = redis.call('GET', dedup)
if existing then return {existing, 0} end
local err = respire_backlog_refusal(control, ready, scheduled, 1)
if err then return err end
err = respire_preflight(
  {{scheduled, 'stream'}, {due, 'zset'}, {dedup, 'string'}},
  {{'XADD', scheduled, '*', 'f', 'v'}, {'XDEL', scheduled, '0-1'}, {'ZADD', due, '0', 'm'},
   {'ZREM', due, 'm'}, {'SET', dedup, 'v', 'PX', '1'}, {'TIME'}})
if err then return err end
local now = respire_now_ms()
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
fields[#fields + 1] = '_respire.job.priority'
fields[#fields + 1] = string.format('%d', priority)
if ttl > 0 then
  fields[#fields + 1] = '_respire.job.expires_at'
  fields[#fields + 1] = string.format('%d', now + ttl)
end
local id = redis.call('XADD', scheduled, '*', unpack(fields))
local ok, zErr = pcall(redis.call, 'ZADD', due, string.format('%d', now + delay), id)
if not ok then
  redis.call('XDEL', scheduled, id)
  return redis.error_reply('RESPIRE_SCHEDULE indexing the staged job failed: ' .. tostring(zErr))
end
local set_ok, setErr = pcall(redis.call, 'SET', dedup, id, 'PX', window)
if not set_ok then
  redis.call('ZREM', due, id)
  redis.call('XDEL', scheduled, id)
  return redis.error_reply('RESPIRE_DEDUP recording the deduplication key failed: ' .. tostring(setErr))
end
return {id, 1}
