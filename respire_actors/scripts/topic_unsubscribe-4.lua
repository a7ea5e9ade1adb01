-- topic_unsubscribe: remove a topic subscription and its delivery metadata.
--
-- KEYS[1]  topic publication stream
-- KEYS[2]  deadlines sorted set of the subscription
-- KEYS[3]  receipts hash of the subscription
-- KEYS[4]  dead-letter stream of the subscription
-- ARGV[1]  subscription name (the consumer group)
-- ARGV[2]  '1' to delete the subscription's dead letters too, '0' to keep them
--
-- Destroys the consumer group (its pending entries stop protecting retained publications)
-- and deletes the deadlines and receipts, so outstanding receipts can no longer complete.
-- Returns 1 if the subscription existed, 0 otherwise (metadata is cleaned either way).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM; all before any write.
--!include lib/preflight.lua

local stream, deadlines, receipts, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, drop_dead = ARGV[1], ARGV[2]
if not group or group == '' or (drop_dead ~= '0' and drop_dead ~= '1') then
  return redis.error_reply('RESPIRE_ARGUMENT topic_unsubscribe arguments are malformed')
end
local err = respire_preflight(
  {{stream, 'stream'}, {deadlines, 'zset'}, {receipts, 'hash'}, {dead, 'stream'}},
  {{'XGROUP', 'DESTROY', stream, group}, {'DEL', deadlines}, {'DEL', receipts}, {'DEL', dead}})
if err then return err end

local existed = 0
if redis.call('EXISTS', stream) == 1 then
  existed = redis.call('XGROUP', 'DESTROY', stream, group)
end
redis.call('DEL', deadlines, receipts)
if drop_dead == '1' then
  redis.call('DEL', dead)
end
return existed
