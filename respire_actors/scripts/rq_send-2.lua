-- rq_send: append one message to a reliable queue or topic, suppressing duplicates of a
-- deduplication id within its window.
--
-- KEYS[1]  stream (the queue's ready stream, or the topic's publication stream)
-- KEYS[2]  deduplication string key of this id
-- ARGV[1]  payload (binary)
-- ARGV[2]  deduplication window in milliseconds (1 .. 2^31-1)
-- ARGV[3..] optional field/value pairs stored after the payload (the W3C trace context,
--          _respire.trace.parent / _respire.trace.state)
--
-- If KEYS[2] exists, nothing is written and the id it records is returned: a duplicate keeps
-- the first payload and does not extend the window, even after the original was acknowledged
-- or dead-lettered (and its trace context). Otherwise the payload is appended (field 'p', then
-- the extra pairs) and KEYS[2] records the new id for the window.
-- Returns {stream id, 1 if appended now | 0 if a duplicate}.
-- Errors: RESPIRE_ARGUMENT (bad window), RESPIRE_WRONGTYPE, RESPIRE_NOPERM; all before any write.
--!include lib/preflight.lua
--!include lib/stream_id.lua
--!include lib/rq_common.lua

local stream, dedup = KEYS[1], KEYS[2]
local window = rq_int(ARGV[2], 1, 2147483647)
if ARGV[1] == nil or not window or #ARGV % 2 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT rq_send needs a payload, a positive window and ' ..
                           'field/value pairs')
end
local err = respire_preflight(
  {{stream, 'stream'}, {dedup, 'string'}},
  {{'GET', dedup}, {'XADD', stream, '*', 'p', 'v'}, {'SET', dedup, 'v', 'PX', '1'}})
if err then return err end

local existing = redis.call('GET', dedup)
if existing then
  return {existing, 0}
end
local id = redis.call('XADD', stream, '*', 'p', ARGV[1], unpack(ARGV, 3))
redis.call('SET', dedup, id, 'PX', window)
return {id, 1}
