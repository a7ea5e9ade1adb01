-- lease_renew: renew the visibility of the deliveries a consumer is still running, in one call.
--
-- KEYS[1]  the stream (a job queue's ready stream, or an application stream)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  n, the number of deliveries (0 .. 1000); then n pairs:
--          entry id (ms-seq), attempt (the delivery count the handler was given)
--
-- For each delivery whose fence holds (the entry is pending for this consumer with this
-- delivery count) and whose body still exists, XCLAIM <stream> <group> <consumer> 0 <id> JUSTID
-- resets its idle time: the same consumer keeps it, and JUSTID does not count a delivery.
-- A delivery whose body was deleted is not claimed (XCLAIM would drop it from the pending list).
-- Returns one status per delivery, in order: 1 renewed; 0 lost (not pending, pending for another
-- consumer, or delivered again); 2 gone (still pending for this delivery but its body was
-- deleted; left as it is).
-- Errors, all before the first write: RESPIRE_ARGUMENT (malformed batch), RESPIRE_WRONGTYPE,
-- RESPIRE_NOPERM; NOGROUP when the consumer group does not exist.
--!include lib/preflight.lua
--!include lib/fence.lua

local stream = KEYS[1]
local group, consumer = ARGV[1], ARGV[2]
local n = tonumber(ARGV[3])
if not n or n < 0 or n > 1000 or n % 1 ~= 0 or #ARGV ~= 3 + n * 2 then
  return redis.error_reply('RESPIRE_ARGUMENT renewal batch is malformed')
end
for i = 0, n - 1 do
  local id, attempt = ARGV[4 + i * 2], tonumber(ARGV[5 + i * 2])
  if not string.match(id, '^%d+%-%d+$') or not attempt or attempt < 1 or attempt % 1 ~= 0 then
    return redis.error_reply('RESPIRE_ARGUMENT renewal ' .. (i + 1) .. ' is malformed')
  end
end
local err = respire_preflight({{stream, 'stream'}}, respire_fence_probes(
  {{'XCLAIM', stream, group, consumer, '0', '0-1', 'JUSTID'}}, stream, false))
if err then return err end

local statuses = {}
for i = 0, n - 1 do
  local id, attempt = ARGV[4 + i * 2], ARGV[5 + i * 2]
  if not respire_fence(stream, group, id, consumer, attempt) then
    statuses[#statuses + 1] = 0
  elseif not respire_entry(stream, id) then
    statuses[#statuses + 1] = 2
  else
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
    statuses[#statuses + 1] = 1
  end
end
return statuses
