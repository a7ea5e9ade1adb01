-- job_claim_pending: recovery and startup replay in one bounded step.
--
-- KEYS[1]  ready stream
-- KEYS[2]  control hash
-- KEYS[3]  events stream
-- KEYS[4]  dead-letter stream
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  mode: 'recover' (XAUTOCLAIM entries idle for at least ARGV[4] ms, from cursor ARGV[5])
--          or 'replay' (re-claim this consumer's own pending entries after ARGV[5])
-- ARGV[4]  minimum idle time in ms (recover mode)
-- ARGV[5]  cursor (an entry id; '0-0' to start)
-- ARGV[6]  page size (1 .. 1000)
-- ARGV[7]  delivery limit (0 = unlimited); counted as prior attempts + this entry's deliveries
--
-- Returns {'paused'} or {'ok', next_cursor, claimed, deleted_count, dead_count} where claimed is
-- a list of {id, fields, deliveries}. Entries over the delivery limit are dead-lettered here
-- (reason delivery-limit, with a dead-letter event) and not returned. PEL references to deleted
-- bodies are cleared and counted. next_cursor '0-0' means the pass is complete.
--!include lib/preflight.lua
--!include lib/fence.lua

local ready, control, events, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer, mode = ARGV[1], ARGV[2], ARGV[3]
local min_idle, cursor, count = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local limit = tonumber(ARGV[7])
if not count or count < 1 or count > 1000 or not limit or not min_idle then
  return redis.error_reply('RESPIRE_ARGUMENT bad recovery arguments')
end
if redis.call('HGET', control, 'paused') == '1' then return {'paused'} end
local err = respire_preflight(
  {{ready, 'stream'}, {events, 'stream'}, {dead, 'stream'}},
  {{'XADD', events, '*', 'f', 'v'}, {'XADD', dead, '*', 'f', 'v'}, {'XACK', ready, group, '0-1'}})
if err then return err end

local entries, next_cursor, deleted = {}, '0-0', 0
if mode == 'recover' then
  local r = redis.call('XAUTOCLAIM', ready, group, consumer, min_idle, cursor, 'COUNT', count)
  next_cursor = r[1]
  entries = r[2]
  if r[3] then deleted = #r[3] end
else
  local start = cursor
  if start ~= '0-0' then start = '(' .. start end
  if start == '0-0' then start = '-' end
  local rows = redis.call('XPENDING', ready, group, start, '+', count, consumer)
  if #rows > 0 then
    local ids = {}
    for i, row in ipairs(rows) do ids[i] = row[1] end
    entries = redis.call('XCLAIM', ready, group, consumer, 0, unpack(ids))
    if #entries < #ids then deleted = #ids - #entries end
    if #rows == count then next_cursor = rows[#rows][1] end
  end
end

local claimed, dead_count = {}, 0
for _, entry in ipairs(entries) do
  local id, fields = entry[1], entry[2]
  if fields then
    local row = redis.call('XPENDING', ready, group, id, id, 1)[1]
    local deliveries = tonumber(row[4])
    local prior = tonumber(respire_field(fields, '_respire.job.attempts') or '0') or 0
    if limit > 0 and prior + deliveries > limit then
      local job_id = respire_field(fields, '_respire.job.id') or ''
      local copy = {}
      for i = 1, #fields do copy[i] = fields[i] end
      for _, v in ipairs({'_respire.source_id', id, '_respire.attempt', tostring(deliveries),
                          '_respire.reason', 'delivery-limit', '_respire.consumer', consumer}) do
        copy[#copy + 1] = v
      end
      redis.call('XADD', dead, '*', unpack(copy))
      redis.call('XADD', events, '*', 'kind', 'dead-letter', 'job_id', job_id, 'entry_id', id,
                 'attempt', tostring(deliveries), 'reason', 'delivery-limit')
      redis.call('XACK', ready, group, id)
      dead_count = dead_count + 1
    else
      claimed[#claimed + 1] = {id, fields, deliveries}
    end
  else
    deleted = deleted + 1
  end
end
return {'ok', next_cursor, claimed, deleted, dead_count}
