-- job_progress: append a progress event for a delivery that is still current.
--
-- KEYS[1]  ready stream
-- KEYS[2]  events stream
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  entry id
-- ARGV[4]  attempt (delivery count)
-- ARGV[5]  job id
-- ARGV[6]  percent (0 .. 100)
--
-- Returns 1 when appended; 0 when the delivery is no longer current (acknowledged, recovered by
-- another attempt) or its body was deleted. Errors: RESPIRE_WRONGTYPE, RESPIRE_NOPERM.
--!include lib/preflight.lua
--!include lib/fence.lua

local ready, events = KEYS[1], KEYS[2]
local percent = tonumber(ARGV[6])
if not percent or percent < 0 or percent > 100 or percent % 1 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT percent must be an integer 0..100')
end
local err = respire_preflight({{ready, 'stream'}, {events, 'stream'}},
                              {{'XADD', events, '*', 'f', 'v'}})
if err then return err end
if not respire_fence(ready, ARGV[1], ARGV[3], ARGV[2], ARGV[4]) then return 0 end
if not respire_entry(ready, ARGV[3]) then return 0 end
redis.call('XADD', events, '*', 'kind', 'progress', 'job_id', ARGV[5], 'entry_id', ARGV[3],
           'attempt', ARGV[4], 'percent', ARGV[6])
return 1
