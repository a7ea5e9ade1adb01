-- recurring_list: read a page of schedule definitions in id order (read-only, consistent).
--
-- KEYS[1]  visiting order (:recurring-order)
-- KEYS[2]  definition hash (:recurring)
-- KEYS[3]  due index (:recurring-due)
-- ARGV[1]  'get' or 'page'
-- ARGV[2]  for 'get' the schedule id; for 'page' the id to start after ('' for the first page)
-- ARGV[3]  page size (1 .. 1000), for 'page'
--
-- Returns a list of {schedule id, definition, due ms or false}; ids without a definition are
-- left out.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE.
--!include lib/preflight.lua

local order, defs, due = KEYS[1], KEYS[2], KEYS[3]
local err = respire_preflight({{order, 'zset'}, {defs, 'hash'}, {due, 'zset'}},
  {{'ZRANGEBYLEX', order, '-', '+'}, {'HGET', defs, 'f'}, {'ZSCORE', due, 'm'}})
if err then return err end
local ids
if ARGV[1] == 'get' then
  ids = {ARGV[2]}
elseif ARGV[1] == 'page' then
  local n = tonumber(ARGV[3])
  if not n or n < 1 or n > 1000 or n % 1 ~= 0 then
    return redis.error_reply('RESPIRE_ARGUMENT page size must be 1 .. 1000')
  end
  local start = '-'
  if ARGV[2] ~= '' then start = '(' .. ARGV[2] end
  ids = redis.call('ZRANGEBYLEX', order, start, '+', 'LIMIT', 0, n)
else
  return redis.error_reply('RESPIRE_ARGUMENT unknown mode')
end
local out = {}
for _, id in ipairs(ids) do
  local blob = redis.call('HGET', defs, id)
  if blob then
    out[#out + 1] = {id, blob, redis.call('ZSCORE', due, id) or false}
  end
end
return out
