-- stream_read: admit up to COUNT never-delivered entries of an application stream.
--
-- KEYS[1]  the stream (consumer group ARGV[1] must exist)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  count: how many entries local capacity admits (1 .. 1000)
--
-- Returns {'ok', entries} (each now pending for this consumer with delivery count 1), or
-- {'empty', last_id}: the newest entry id (or 0-0) to block on with XREAD outside the script.
-- Errors: NOGROUP when the group is missing; RESPIRE_ARGUMENT for a bad count.
local stream = KEYS[1]
local count = tonumber(ARGV[3])
if not count or count < 1 or count > 1000 then
  return redis.error_reply('RESPIRE_ARGUMENT read count out of range')
end
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count, 'STREAMS', stream, '>')
if reply and reply[1] and #reply[1][2] > 0 then
  return {'ok', reply[1][2]}
end
local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
if last[1] then return {'empty', last[1][1]} end
return {'empty', '0-0'}
