-- rq_nack: reject deliveries of a reliable queue or topic subscription, fenced by receipt.
--
-- KEYS[1]  stream (queue ready stream, or topic publication stream)
-- KEYS[2]  deadlines sorted set of this endpoint
-- KEYS[3]  receipts hash of this endpoint
-- ARGV[1]  delay in milliseconds before the message is due again (0 .. 2^31-1), or 'release'
-- ARGV[2..] receipts, three values each: entry id, delivery count, delivery stamp
--
-- For each receipt that still holds (see rq_ack), the receipt is revoked at once (the hash
-- keeps only the delivery count) and the entry's deadline becomes now + delay on the server
-- clock; a zero delay makes it due immediately. The next receive redelivers it (or, at the
-- delivery limit, moves it to the dead letters). 'release' hands back messages the receiver
-- leased but never gave to the application (an iterator's buffer when it closes): due at
-- once, and the delivery is not counted (the hash keeps the count minus one), so the next
-- receive's delivery has the count this one had.
-- Returns one status per receipt: 1 rejected now, 0 expired/revoked/superseded/completed.
-- Repeating a call is harmless (the second run returns 0s).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM; all before any write.
--!include lib/preflight.lua
--!include lib/stream_id.lua
--!include lib/rq_common.lua

local stream, deadlines, receipts = KEYS[1], KEYS[2], KEYS[3]
local release = ARGV[1] == 'release'
local delay = release and 0 or rq_int(ARGV[1], 0, 2147483647)
if not delay or #ARGV < 4 or (#ARGV - 1) % 3 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT rq_nack arguments are malformed')
end
for i = 2, #ARGV, 3 do
  if not respire_id_parse(ARGV[i]) or not rq_int(ARGV[i + 1], 1, 2147483647)
      or not string.match(ARGV[i + 2], '^%d+$') then
    return redis.error_reply('RESPIRE_ARGUMENT malformed receipt')
  end
end
local err = respire_preflight({{stream, 'stream'}, {deadlines, 'zset'}, {receipts, 'hash'}},
  {{'HGET', receipts, 'f'}, {'HSET', receipts, 'f', 'v'}, {'ZSCORE', deadlines, 'm'},
   {'ZADD', deadlines, '1', 'm'}})
if err then return err end

local now = rq_now()
local statuses = {}
for i = 2, #ARGV, 3 do
  local id, count = ARGV[i], ARGV[i + 1]
  local status = 0
  if redis.call('HGET', receipts, id) == count .. ':' .. ARGV[i + 2] then
    local due = redis.call('ZSCORE', deadlines, id)
    if due and tonumber(due) > now then
      local kept = tonumber(count)
      if release then kept = kept - 1 end
      redis.call('HSET', receipts, id, string.format('%d', kept) .. ':-')
      redis.call('ZADD', deadlines, now + delay, id)
      status = 1
    end
  end
  statuses[#statuses + 1] = status
end
return statuses
