-- job_promote: move at most one batch of due staged jobs to the ready stream, in one step.
--
-- KEYS[1]  staging stream (:scheduled)
-- KEYS[2]  due-time index (:due)
-- KEYS[3]  ready stream
-- ARGV[1]  batch size (1 .. 256)
--
-- Selects the oldest due members (score <= server time; equal scores in lexicographic staging
-- id order), then appends them to the ready stream by descending _respire.job.priority, keeping
-- selection order for equal priorities. Each promoted job is appended with all its fields and
-- removed from both staging keys. Index members whose staged body is gone are removed and
-- skipped; jobs whose _respire.job.expires_at has passed are removed without being promoted.
-- A job is therefore either staged or ready, never both, and never promoted twice.
-- Returns {promoted, expired, missing, next_due_ms} where next_due_ms is how long until the
-- earliest remaining member is due (0 = due now, -1 = nothing staged).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written: every command,
-- also the final ZRANGE, is checked before the first promotion).
--!include lib/preflight.lua
--!include lib/fence.lua

local scheduled, due, ready = KEYS[1], KEYS[2], KEYS[3]
local batch = tonumber(ARGV[1])
if not batch or batch < 1 or batch > 256 or batch % 1 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT batch size must be 1 .. 256')
end
local err = respire_preflight(
  {{scheduled, 'stream'}, {due, 'zset'}, {ready, 'stream'}},
  {{'TIME'}, {'ZRANGEBYSCORE', due, '-inf', '0'}, {'XRANGE', scheduled, '-', '+'},
   {'XADD', ready, '*', 'f', 'v'}, {'XDEL', scheduled, '0-1'}, {'ZREM', due, 'm'},
   {'ZRANGE', due, '0', '0'}})
if err then return err end
local now = respire_now_ms()
local function clock() return now end
local ids = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, batch)
local picked, expired, missing = {}, 0, 0
for i, id in ipairs(ids) do
  local fields = respire_entry(scheduled, id)
  if not fields then
    redis.call('ZREM', due, id)
    missing = missing + 1
  elseif respire_expired(fields, clock) then
    redis.call('ZREM', due, id)
    redis.call('XDEL', scheduled, id)
    expired = expired + 1
  else
    local p = tonumber(respire_field(fields, '_respire.job.priority') or '0') or 0
    picked[#picked + 1] = {id = id, fields = fields, priority = p, order = i}
  end
end
table.sort(picked, function(a, b)
  if a.priority ~= b.priority then return a.priority > b.priority end
  return a.order < b.order
end)
for _, job in ipairs(picked) do
  redis.call('XADD', ready, '*', unpack(job.fields))
  redis.call('ZREM', due, job.id)
  redis.call('XDEL', scheduled, job.id)
end
local next_due = -1
local first = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
if first[2] then
  next_due = tonumber(first[2]) - now
  if next_due < 0 then next_due = 0 end
end
return {#picked, expired, missing, next_due}
