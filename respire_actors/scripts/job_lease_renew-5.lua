-- job_lease_renew: renew, in one call, everything a job worker holds for its running handlers:
-- the visibility of each delivery and, for grouped jobs, the group concurrency lease.
--
-- KEYS[1]  ready stream
-- KEYS[2]  concurrency leases (:group-leases)
-- KEYS[3]  lease owners (:group-owners)
-- KEYS[4]  group policy (:group-policy; lease duration per group, default 60 s)
-- KEYS[5]  control hash (the recorded visibility timeout; see respire_lease_record)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
-- ARGV[3]  n, the number of deliveries (0 .. 1000); then n triples:
--          entry id (ms-seq), attempt (the delivery count the handler was given),
--          job group ('' for an ungrouped job)
-- ARGV[4 + 3n] optional: the worker's visibility timeout in ms (0 or absent: none). When
--          given, it is recorded in the control hash as recovery does (lib/fence.lua), so a
--          worker busy with long jobs, whose recovery passes wait for free capacity, keeps its
--          longer timeout recorded and no worker with a shorter one claims its deliveries
--
-- Per delivery, in order: the fence (pending for this consumer with this delivery count), the
-- body (a deleted body is not claimed: XCLAIM would drop it from the pending list), then for a
-- grouped job its concurrency lease (held by this consumer for this attempt; extended to server
-- time + the group's lease duration), and only then XCLAIM <ready> <group> <consumer> 0 <id>
-- JUSTID, which resets the idle time without counting a delivery. A delivery whose group lease
-- was lost is not claimed, so it is recovered one visibility timeout after its last renewal.
-- Returns one status per delivery: 1 renewed; for a grouped job renewed, its group's lease
-- duration in ms instead (always >= 100: the renewer paces itself by it, so a group lease
-- shorter than the visibility timeout is renewed in time); 0 lost (fence failed, or the group
-- lease was released, taken over or expired); 2 gone (pending for this delivery, body
-- deleted).
-- Errors, all before the first write: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM;
-- NOGROUP when the consumer group does not exist.
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/group_lease.lua

local ready, leases, owners, policy, control = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, consumer = ARGV[1], ARGV[2]
local n = tonumber(ARGV[3])
if not n or n < 0 or n > 1000 or n % 1 ~= 0 or (#ARGV ~= 3 + n * 3 and #ARGV ~= 4 + n * 3) then
  return redis.error_reply('RESPIRE_ARGUMENT renewal batch is malformed')
end
local own = tonumber(ARGV[4 + n * 3] or '0')
if not own or own < 0 or own > 2147483647 or own % 1 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT visibility timeout out of range')
end
local grouped = false
for i = 0, n - 1 do
  local id, attempt = ARGV[4 + i * 3], tonumber(ARGV[5 + i * 3])
  if not string.match(id, '^%d+%-%d+$') or not attempt or attempt < 1 or attempt % 1 ~= 0 then
    return redis.error_reply('RESPIRE_ARGUMENT renewal ' .. (i + 1) .. ' is malformed')
  end
  if ARGV[6 + i * 3] ~= '' then grouped = true end
end
local types = {{ready, 'stream'}}
local probes = respire_fence_probes({{'XCLAIM', ready, group, consumer, '0', '0-1', 'JUSTID'}},
                                    ready, grouped)
if own > 0 then
  types[#types + 1] = {control, 'hash'}
  probes[#probes + 1] = {'HSET', control, 'lease.ms', '0'}
  probes[#probes + 1] = {'HMGET', control, 'lease.ms'}
end
if grouped then
  types[#types + 1] = {leases, 'zset'}
  types[#types + 1] = {owners, 'hash'}
  types[#types + 1] = {policy, 'hash'}
  probes[#probes + 1] = {'HSET', owners, 'f', 'v'}
  probes[#probes + 1] = {'ZADD', leases, '0', 'm'}
  probes[#probes + 1] = {'HGET', owners, 'f'}
  probes[#probes + 1] = {'HGET', policy, 'f'}
end
local err = respire_preflight(types, probes)
if err then return err end
respire_lease_record(control, own)

local now = nil
local statuses = {}
for i = 0, n - 1 do
  local id, attempt, g = ARGV[4 + i * 3], ARGV[5 + i * 3], ARGV[6 + i * 3]
  local status, reply = 1, 1
  if not respire_fence(ready, group, id, consumer, attempt) then
    status = 0
  elseif not respire_entry(ready, id) then
    status = 2
  elseif g ~= '' then
    now = now or respire_now_ms()
    local p = respire_group_policy(policy, g)
    status = group_lease_renew(leases, owners, g, id, consumer, attempt, now, p.lease)
    if status == 1 then reply = p.lease end
  end
  if status == 1 then redis.call('XCLAIM', ready, group, consumer, 0, id, 'JUSTID') end
  statuses[#statuses + 1] = status == 1 and reply or status
end
return statuses
