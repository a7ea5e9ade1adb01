-- topic_subscribe: create a topic subscription (its consumer group) if it does not exist.
--
-- KEYS[1]  topic publication stream
-- KEYS[2]  deadlines sorted set of the subscription
-- KEYS[3]  receipts hash of the subscription
-- ARGV[1]  subscription name (the consumer group)
-- ARGV[2]  start: 'beginning' (every retained publication) or 'tail' (only later ones)
--
-- Runs atomically with topic_trim, which is how group creation is coordinated with trimming:
-- a new group starting at the beginning protects everything retained at that moment.
-- An existing subscription is left untouched (its position is not moved). On creation, any
-- delivery metadata left behind by an earlier subscription of the same name is removed, since
-- it referred to the destroyed group's pending entries.
-- Returns 1 if created now, 0 if it already existed.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM; all before any write.
--!include lib/preflight.lua

local stream, deadlines, receipts = KEYS[1], KEYS[2], KEYS[3]
local group, start = ARGV[1], ARGV[2]
if not group or group == '' or (start ~= 'beginning' and start ~= 'tail') then
  return redis.error_reply('RESPIRE_ARGUMENT topic_subscribe arguments are malformed')
end
local err = respire_preflight({{stream, 'stream'}, {deadlines, 'zset'}, {receipts, 'hash'}},
  {{'XGROUP', 'CREATE', stream, group, '$', 'MKSTREAM'}, {'XINFO', 'CONSUMERS', stream, group},
   {'DEL', deadlines}, {'DEL', receipts}})
if err then return err end

if redis.call('EXISTS', stream) == 1 then
  local info = redis.pcall('XINFO', 'CONSUMERS', stream, group)
  if not (type(info) == 'table' and info.err) then
    return 0
  end
end
redis.call('XGROUP', 'CREATE', stream, group, start == 'beginning' and '0' or '$', 'MKSTREAM')
redis.call('DEL', deadlines, receipts)
return 1
