-- recurring_tick: commit one tick of one schedule: append it to the ready stream as an ordinary
-- immediate job and advance the schedule's due time, in one step, at most once per
-- (revision, tick).
--
-- KEYS[1]  ready stream
-- KEYS[2]  definition hash (:recurring)
-- KEYS[3]  due index (:recurring-due)
-- ARGV[1]  schedule id
-- ARGV[2]  revision the caller's snapshot saw
-- ARGV[3]  due time (unix ms) the caller's snapshot saw
-- ARGV[4]  tick (unix ms, at or after ARGV[3])
-- ARGV[5]  next due time (unix ms, after ARGV[4]) or '-' when there is no representable
--          next occurrence (the definition stays, removable, but is no longer due)
-- ARGV[6..] field/value pairs of the job envelope (job id, payload, schedule, tick, ...)
--
-- Compare-and-set: commits only while the stored revision and due time are the ones the caller
-- saw. After a commit the due time has moved past the tick, so a repeated call (a lost reply,
-- another scheduler, a restart, a clock that jumped back) writes nothing.
-- Returns {'committed', entry id} or {'stale'} (revision or due changed, or schedule removed).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written); if advancing
-- the due index or recording the last tick fails after the append, the appended entry is deleted
-- and the due time restored before RESPIRE_RECURRING is returned.
--!include lib/preflight.lua
--!include lib/recurring.lua

local ready, defs, due = KEYS[1], KEYS[2], KEYS[3]
local id, revision = ARGV[1], ARGV[2]
local expected, tick = tonumber(ARGV[3]), tonumber(ARGV[4])
local next_due = ARGV[5]
if not expected or not tick or expected % 1 ~= 0 or tick % 1 ~= 0 or tick < expected then
  return redis.error_reply('RESPIRE_ARGUMENT tick must be an integer at or after the due time')
end
if next_due ~= '-' then
  next_due = tonumber(next_due)
  if not next_due or next_due % 1 ~= 0 or next_due <= tick then
    return redis.error_reply('RESPIRE_ARGUMENT next due time must be an integer after the tick')
  end
end
if #ARGV < 7 or (#ARGV - 5) % 2 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT the envelope must be field/value pairs')
end
local err = respire_preflight(
  {{ready, 'stream'}, {defs, 'hash'}, {due, 'zset'}},
  {{'XADD', ready, '*', 'f', 'v'}, {'XDEL', ready, '0-1'}, {'ZADD', due, '0', id},
   {'ZREM', due, id}, {'HSET', defs, id, 'v'}})
if err then return err end
local blob = redis.call('HGET', defs, id)
if not blob then return {'stale'} end
local format, stored, _, rest, tail = respire_recurring_parse(blob)
if not format then
  return redis.error_reply('RESPIRE_RECURRING malformed definition of schedule ' .. id)
end
if stored ~= revision then return {'stale'} end
local score = redis.call('ZSCORE', due, id)
if not score or tonumber(score) ~= expected then return {'stale'} end
local entry = redis.call('XADD', ready, '*', unpack(ARGV, 6))
local ok, failure
if next_due == '-' then
  ok, failure = pcall(redis.call, 'ZREM', due, id)
else
  ok, failure = pcall(redis.call, 'ZADD', due, next_due, id)
end
if not ok then
  redis.call('XDEL', ready, entry)
  return redis.error_reply('RESPIRE_RECURRING advancing the due index failed: ' .. tostring(failure))
end
ok, failure = pcall(redis.call, 'HSET', defs, id,
  format .. ' ' .. stored .. ' ' .. ARGV[4] .. ' ' .. rest .. tail)
if not ok then
  redis.call('ZADD', due, expected, id)
  redis.call('XDEL', ready, entry)
  return redis.error_reply('RESPIRE_RECURRING recording the last tick failed: ' .. tostring(failure))
end
return {'committed', entry}
