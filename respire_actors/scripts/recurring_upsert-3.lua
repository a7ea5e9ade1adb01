-- recurring_upsert: create or replace one recurring schedule (a new revision) in one step.
--
-- KEYS[1]  definition hash (:recurring; field = schedule id)
-- KEYS[2]  due index (:recurring-due; sorted set, score = next due unix ms)
-- KEYS[3]  visiting order (:recurring-order; sorted set, every score 0, ordered by id)
-- ARGV[1]  schedule id
-- ARGV[2]  definition (header line with a fresh revision, newline, payload)
-- ARGV[3]  first due time, unix ms (strictly after the upsert time, computed by the caller)
--
-- Replacing a definition replaces its revision, so a tick computed from the old definition can
-- no longer commit (recurring_tick compares the revision). Jobs already enqueued stay.
-- Returns 1 when the schedule is new, 0 when an existing definition was replaced.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written).
--!include lib/preflight.lua
--!include lib/recurring.lua

local defs, due, order = KEYS[1], KEYS[2], KEYS[3]
local id, blob, first = ARGV[1], ARGV[2], tonumber(ARGV[3])
if not first or first % 1 ~= 0 or first < 0 then
  return redis.error_reply('RESPIRE_ARGUMENT first due time must be a non-negative integer')
end
if not respire_recurring_parse(blob) then
  return redis.error_reply('RESPIRE_ARGUMENT malformed schedule definition')
end
local err = respire_preflight(
  {{defs, 'hash'}, {due, 'zset'}, {order, 'zset'}},
  {{'HSET', defs, id, 'v'}, {'ZADD', due, '0', id}, {'ZADD', order, '0', id}})
if err then return err end
local created = redis.call('HSET', defs, id, blob)
redis.call('ZADD', due, first, id)
redis.call('ZADD', order, 0, id)
return created
