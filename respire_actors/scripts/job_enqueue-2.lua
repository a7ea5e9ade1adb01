-- job_enqueue: append a job to the ready stream unless its id was enqueued within the window.
--
-- KEYS[1]  ready stream
-- KEYS[2]  deduplication key of this job id (string: the winning entry id)
-- ARGV[1]  deduplication window in milliseconds (1 .. 2^31-1)
-- ARGV[2..] field/value pairs of the envelope (job id, payload, trace context, ...)
--
-- Returns {entry_id, 1} for a new job, {original_entry_id, 0} for a duplicate.
-- Errors: RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written); if recording the deduplication
-- key fails after the append, the new entry is deleted again before the error is returned.
--!include lib/preflight.lua

local ready, dedup = KEYS[1], KEYS[2]
local window = tonumber(ARGV[1])
if not window or window < 1 or window > 2147483647 then
  return redis.error_reply('RESPIRE_ARGUMENT deduplication window out of range')
end
local existing = redis.call('GET', dedup)
if existing then return {existing, 0} end
local err = respire_preflight(
  {{ready, 'stream'}, {dedup, 'string'}},
  {{'XADD', ready, '*', 'f', 'v'}, {'XDEL', ready, '0-1'}, {'SET', dedup, 'v', 'PX', '1'}})
if err then return err end
local fields = {}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', ready, '*', unpack(fields))
local ok, setErr = pcall(redis.call, 'SET', dedup, id, 'PX', window)
if not ok then
  redis.call('XDEL', ready, id)
  return redis.error_reply('RESPIRE_DEDUP recording the deduplication key failed: ' .. tostring(setErr))
end
return {id, 1}
