-- job_enqueue: append a job to the ready stream unless its id was enqueued within the window.
--
-- KEYS[1]  ready stream
-- KEYS[2]  deduplication key of this job id (string: the winning entry id)
-- KEYS[3]  control hash (its max_backlog field is the optional backlog bound)
-- KEYS[4]  staging stream (:scheduled; counted in the backlog)
-- ARGV[1]  deduplication window in milliseconds (1 .. 2^31-1)
-- ARGV[2..] field/value pairs of the envelope (job id, payload, trace context, ...)
--
-- Returns {entry_id, 1} for a new job, {original_entry_id, 0} for a duplicate (also when the
-- queue is full: a duplicate adds nothing).
-- Errors: RESPIRE_FULL (the backlog bound is reached, see lib/backlog.lua), RESPIRE_WRONGTYPE,
-- RESPIRE_NOPERM (nothing written); if recording the deduplication
-- key fails after the append, the new entry is deleted again before the error is returned.
--!include lib/preflight.lua
--!include lib/backlog.lua
--
-- Cost: this runs for every enqueue, so the checks are inlined (no helper tables). The GET of
-- the deduplication key doubles as its type check: GET fails only on a non-string key, and
-- nothing has been written at that point.

local ready, dedup, control, scheduled = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local window = tonumber(ARGV[1])
if not window or window < 1 or window > 2147483647 then
  return redis.error_reply('RESPIRE_ARGUMENT deduplication window out of range')
end
local existing = redis.pcall('GET', dedup)
if type(existing) == 'table' and existing.err then
  return respire_expect_type(dedup, 'string') or respire_expect_perm('GET', dedup)
    or redis.error_reply(existing.err)
end
if existing then return {existing, 0} end
local err = respire_backlog_refusal(control, ready, scheduled, 1)
if err then return err end
err = respire_expect_type(ready, 'stream')
if err then return err end
if not redis.acl_check_cmd('XADD', ready, '*', 'f', 'v') then
  return respire_expect_perm('XADD', ready, '*', 'f', 'v')
end
if not redis.acl_check_cmd('XDEL', ready, '0-1') then
  return respire_expect_perm('XDEL', ready, '0-1')
end
if not redis.acl_check_cmd('SET', dedup, 'v', 'PX', '1') then
  return respire_expect_perm('SET', dedup, 'v', 'PX', '1')
end
local id = redis.call('XADD', ready, '*', unpack(ARGV, 2))
local ok, setErr = pcall(redis.call, 'SET', dedup, id, 'PX', window)
if not ok then
  redis.call('XDEL', ready, id)
  return redis.error_reply('RESPIRE_DEDUP recording the deduplication key failed: ' .. tostring(setErr))
end
return {id, 1}
