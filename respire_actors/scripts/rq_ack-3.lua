-- rq_ack: complete deliveries of a reliable queue or topic subscription, fenced by receipt.
--
-- KEYS[1]  stream (queue ready stream, or topic publication stream)
-- KEYS[2]  deadlines sorted set of this endpoint
-- KEYS[3]  receipts hash of this endpoint
-- ARGV[1]  consumer group (the queue's private group, or the subscription name)
-- ARGV[2]  mode: 'queue' (acknowledge and delete the entry) or 'topic' (acknowledge only)
-- ARGV[3..] receipts, three values each: entry id, delivery count, delivery stamp
--
-- A receipt holds while the receipts hash still records exactly that count and stamp (not
-- revoked by a NACK, not superseded by a redelivery, not completed) and its deadline is later
-- than the server clock. A holding receipt removes the entry's delivery metadata and
-- acknowledges it (XACKDEL when the serving server offers and permits it, else XACK + XDEL).
-- Returns one status per receipt: 1 completed now, 0 expired/revoked/superseded/completed.
-- Repeating a call is harmless (the second run returns 0s).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM; all before any write.
--!include lib/preflight.lua
--!include lib/stream_id.lua
--!include lib/rq_common.lua

local stream, deadlines, receipts = KEYS[1], KEYS[2], KEYS[3]
local group = ARGV[1]
local delete = rq_mode(ARGV[2])
if delete == nil or not group or group == '' or #ARGV < 5 or (#ARGV - 2) % 3 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT rq_ack arguments are malformed')
end
for i = 3, #ARGV, 3 do
  if not respire_id_parse(ARGV[i]) or not rq_int(ARGV[i + 1], 1, 2147483647)
      or not string.match(ARGV[i + 2], '^%d+$') then
    return redis.error_reply('RESPIRE_ARGUMENT malformed receipt')
  end
end

local xackdel = delete and rq_xackdel_usable(stream, group)
local perms = {{'HGET', receipts, 'f'}, {'HDEL', receipts, 'f'}, {'ZSCORE', deadlines, 'm'},
  {'ZREM', deadlines, 'm'}}
for _, probe in ipairs(rq_completion_probes(stream, group, delete, xackdel)) do
  perms[#perms + 1] = probe
end
local err = respire_preflight({{stream, 'stream'}, {deadlines, 'zset'}, {receipts, 'hash'}}, perms)
if err then return err end

local now = rq_now()
local statuses = {}
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  local status = 0
  if redis.call('HGET', receipts, id) == ARGV[i + 1] .. ':' .. ARGV[i + 2] then
    local due = redis.call('ZSCORE', deadlines, id)
    if due and tonumber(due) > now then
      redis.call('ZREM', deadlines, id)
      redis.call('HDEL', receipts, id)
      rq_finish(stream, group, id, delete, xackdel)
      status = 1
    end
  end
  statuses[#statuses + 1] = status
end
return statuses
