-- recurring_scan: take the next candidates of a scheduling pass, round-robin by schedule id,
-- and advance the shared cursor past them, in one step.
--
-- KEYS[1]  visiting order (:recurring-order)
-- KEYS[2]  shared cursor (:recurring-cursor; string: the last visited schedule id)
-- KEYS[3]  definition hash (:recurring)
-- KEYS[4]  due index (:recurring-due)
-- ARGV[1]  most candidates (1 .. 256)
--
-- Candidates are the ids after the cursor in id order, wrapping once to the start; each id is
-- returned at most once per call. Schedules that are not due count against the budget, so a
-- catch-up backlog cannot starve the others. The cursor is an id, not a position: it keeps
-- working after restarts and after its own schedule is removed.
-- Returns a list of {schedule id, definition or false, due ms or false}: a consistent snapshot
-- of each candidate (recurring_tick later refuses to commit against a changed one).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written).
--!include lib/preflight.lua

local order, cursor_key, defs, due = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local n = tonumber(ARGV[1])
if not n or n < 1 or n > 256 or n % 1 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT candidate budget must be 1 .. 256')
end
local err = respire_preflight(
  {{order, 'zset'}, {cursor_key, 'string'}, {defs, 'hash'}, {due, 'zset'}},
  {{'SET', cursor_key, 'v'}, {'GET', cursor_key}, {'ZRANGEBYLEX', order, '-', '+'},
   {'HGET', defs, 'f'}, {'ZSCORE', due, 'm'}})
if err then return err end
local cursor = redis.call('GET', cursor_key)
local ids
if cursor then
  ids = redis.call('ZRANGEBYLEX', order, '(' .. cursor, '+', 'LIMIT', 0, n)
  if #ids < n then
    local wrapped = redis.call('ZRANGEBYLEX', order, '-', '[' .. cursor, 'LIMIT', 0, n - #ids)
    for _, id in ipairs(wrapped) do ids[#ids + 1] = id end
  end
else
  ids = redis.call('ZRANGEBYLEX', order, '-', '+', 'LIMIT', 0, n)
end
if #ids == 0 then return {} end
redis.call('SET', cursor_key, ids[#ids])
local out = {}
for i, id in ipairs(ids) do
  local blob = redis.call('HGET', defs, id)
  local score = redis.call('ZSCORE', due, id)
  out[i] = {id, blob or false, score or false}
end
return out
