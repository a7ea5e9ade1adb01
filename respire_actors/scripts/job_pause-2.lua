-- job_pause: pause or resume a queue persistently, with its event, atomically and idempotently.
--
-- KEYS[1]  control hash (field "paused" = "1" while paused)
-- KEYS[2]  events stream
-- ARGV[1]  'pause' or 'resume'
--
-- A transition appends a 'paused' / 'resumed' event (empty job_id, entry_id 0-0, attempt 0) in
-- the same step as the state change; a call that changes nothing appends nothing.
-- Returns 1 when the state changed, 0 when it already was as asked.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written); should the event
-- append still fail, the previous state is restored and RESPIRE_PAUSE is returned.
--!include lib/preflight.lua

local control, events = KEYS[1], KEYS[2]
local action = ARGV[1]
if action ~= 'pause' and action ~= 'resume' then
  return redis.error_reply('RESPIRE_ARGUMENT action must be pause or resume')
end
local err = respire_preflight({{control, 'hash'}, {events, 'stream'}},
  {{'HSET', control, 'paused', '1'}, {'HDEL', control, 'paused'}, {'XADD', events, '*', 'f', 'v'},
   {'HGET', control, 'paused'}})
if err then return err end
local paused = redis.call('HGET', control, 'paused') == '1'
if (action == 'pause') == paused then return 0 end
local kind = 'resumed'
if action == 'pause' then
  redis.call('HSET', control, 'paused', '1')
  kind = 'paused'
else
  redis.call('HDEL', control, 'paused')
end
local ok, xErr = pcall(redis.call, 'XADD', events, '*', 'kind', kind, 'job_id', '',
                       'entry_id', '0-0', 'attempt', '0')
if not ok then
  if paused then redis.call('HSET', control, 'paused', '1') else redis.call('HDEL', control, 'paused') end
  return redis.error_reply('RESPIRE_PAUSE appending the ' .. kind .. ' event failed: ' .. tostring(xErr))
end
return 1
