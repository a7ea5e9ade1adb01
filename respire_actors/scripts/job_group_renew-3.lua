-- job_group_renew: renew a batch of group concurrency leases (the lease renewer's step).
--
-- KEYS[1]  concurrency leases (:group-leases)
-- KEYS[2]  lease owners (:group-owners)
-- KEYS[3]  group policy (:group-policy; lease duration per group, default 60 s)
-- ARGV[1]  consumer name
-- ARGV[2..] triples: entry id, attempt (delivery count), group
--
-- Each lease still held by this consumer for that attempt is extended to server time + the
-- group's lease duration (see group_lease_renew in lib/group_lease.lua).
-- Returns one status per triple: 1 renewed, 0 lost (released, taken over by another consumer or
-- a later attempt, or expired and taken by an admission check; nothing written for it).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM before any write.
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/group_lease.lua

local leases, owners, policy = KEYS[1], KEYS[2], KEYS[3]
local consumer = ARGV[1]
if not consumer or (#ARGV - 1) % 3 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT renewals must be entry id, attempt, group triples')
end
for i = 2, #ARGV, 3 do
  local attempt = tonumber(ARGV[i + 1])
  if not attempt or attempt < 1 or attempt % 1 ~= 0 or ARGV[i + 2] == '' then
    return redis.error_reply('RESPIRE_ARGUMENT bad attempt or empty group')
  end
end
local err = respire_preflight({{leases, 'zset'}, {owners, 'hash'}, {policy, 'hash'}},
                              {{'HSET', owners, 'f', 'v'}, {'ZADD', leases, '0', 'm'}})
if err then return err end
local now = respire_now_ms()
local statuses = {}
for i = 2, #ARGV, 3 do
  local g = ARGV[i + 2]
  local p = respire_group_policy(policy, g)
  statuses[#statuses + 1] = group_lease_renew(leases, owners, g, ARGV[i], consumer,
                                              ARGV[i + 1], now, p.lease)
end
return statuses
