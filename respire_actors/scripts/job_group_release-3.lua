-- job_group_release: release group concurrency leases after unsuccessful processing (a nack
-- that leaves the entry pending for visibility recovery), fenced by consumer and attempt.
--
-- KEYS[1]  concurrency leases (:group-leases)
-- KEYS[2]  lease owners (:group-owners)
-- KEYS[3]  parked groups (:group-parked)
-- ARGV[1]  consumer name
-- ARGV[2..] triples: entry id, attempt (delivery count), group
--
-- A lease is released only when this consumer holds it for that attempt, so a stale or repeated
-- release never frees a replacement attempt's permit; a parked group whose permit was freed is
-- woken on the next read.
-- Returns one status per triple: 1 released, 0 not held (nothing written for it).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM before any write.
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/group_lease.lua

local leases, owners, parked = KEYS[1], KEYS[2], KEYS[3]
local consumer = ARGV[1]
if not consumer or (#ARGV - 1) % 3 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT releases must be entry id, attempt, group triples')
end
for i = 2, #ARGV, 3 do
  local attempt = tonumber(ARGV[i + 1])
  if not attempt or attempt < 0 or attempt % 1 ~= 0 or ARGV[i + 2] == '' then
    return redis.error_reply('RESPIRE_ARGUMENT bad attempt or empty group')
  end
end
local err = respire_preflight({{leases, 'zset'}, {owners, 'hash'}, {parked, 'zset'}},
                              respire_lease_probes({}, leases, owners, parked))
if err then return err end
local statuses = {}
for i = 2, #ARGV, 3 do
  statuses[#statuses + 1] = respire_group_release(leases, owners, parked, ARGV[i + 2], ARGV[i],
                                                  consumer, ARGV[i + 1])
end
return statuses
