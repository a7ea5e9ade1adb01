-- recurring_remove: delete one recurring schedule, so no further tick of it can commit.
--
-- KEYS[1]  definition hash (:recurring)
-- KEYS[2]  due index (:recurring-due)
-- KEYS[3]  visiting order (:recurring-order)
-- ARGV[1]  schedule id
--
-- The shared cursor may still name the removed id; visiting resumes after it by id order.
-- Jobs already enqueued are not retracted.
-- Returns 1 when a definition existed, else 0.
-- Errors: RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written).
--!include lib/preflight.lua

local defs, due, order = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1]
local err = respire_preflight(
  {{defs, 'hash'}, {due, 'zset'}, {order, 'zset'}},
  {{'HDEL', defs, id}, {'ZREM', due, id}, {'ZREM', order, id}})
if err then return err end
local existed = redis.call('HDEL', defs, id)
redis.call('ZREM', due, id)
redis.call('ZREM', order, id)
return existed
