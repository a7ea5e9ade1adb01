-- job_partitions: record a partitioned job queue's partition count, or compare with it.
--
-- KEYS[1]  the count key ({respire-job:<name>}:partitions, a string)
-- ARGV[1]  'init' (store when absent, else compare), 'set' (store: a partition's copy of a
--          record just confirmed, replacing one left by an earlier count) or 'get' (read only)
-- ARGV[2]  the partition count (1 .. 1024; 'init', 'set')
--
-- Returns for 'init': {'stored', n}, {'match', n} or {'mismatch', stored}; for 'set':
-- {'stored', n}; for 'get': {'absent'} or {'match', stored}.
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM (nothing written).
--!include lib/preflight.lua

local key = KEYS[1]
local action = ARGV[1]
if action ~= 'init' and action ~= 'get' and action ~= 'set' then
  return redis.error_reply('RESPIRE_ARGUMENT action must be init, set or get')
end
local n = tonumber(ARGV[2] or '')
if action ~= 'get' and (not n or n < 1 or n > 1024 or n % 1 ~= 0) then
  return redis.error_reply('RESPIRE_ARGUMENT partition count must be an integer 1 .. 1024')
end
local perms = {{'GET', key}}
if action ~= 'get' then perms[2] = {'SET', key, '1', 'NX'} end
local err = respire_preflight({{key, 'string'}}, perms)
if err then return err end
if action == 'set' then
  redis.call('SET', key, tostring(n))
  return {'stored', n}
end
local stored = redis.call('GET', key)
if not stored then
  if action == 'get' then return {'absent'} end
  redis.call('SET', key, tostring(n))
  return {'stored', n}
end
local s = tonumber(stored)
if not s or s % 1 ~= 0 or s < 1 or s > 1024 then
  return redis.error_reply('RESPIRE_WRONGTYPE ' .. key .. ' holds ' .. stored .. ', not a partition count')
end
if action == 'get' or s == n then return {'match', s} end
return {'mismatch', s}
