-- job_read: admit up to COUNT never-delivered jobs to this consumer, after the queue checks.
--
-- KEYS[1]  ready stream (consumer group ARGV[1] must exist)
-- KEYS[2]  control hash (field "paused" = "1" while the queue is paused)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  count: how many entries local capacity admits (1 .. 1000)
--
-- Returns {'paused'}; or {'empty', last_id} where last_id is the newest entry id (or 0-0), to
-- block on with XREAD outside the script; or {'ok', entries} with entries as XREADGROUP gives
-- them ({id, {field, value, ...}}), each now pending for this consumer with delivery count 1.
-- Errors: NOGROUP when the consumer group is missing (the reader recreates it).
local ready, control = KEYS[1], KEYS[2]
local count = tonumber(ARGV[3])
if not count or count < 1 or count > 1000 then
  return redis.error_reply('RESPIRE_ARGUMENT read count out of range')
end
if redis.call('HGET', control, 'paused') == '1' then return {'paused'} end
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count, 'STREAMS', ready, '>')
if reply and reply[1] and #reply[1][2] > 0 then
  return {'ok', reply[1][2]}
end
local last = redis.call('XREVRANGE', ready, '+', '-', 'COUNT', 1)
if last[1] then return {'empty', last[1][1]} end
return {'empty', '0-0'}
