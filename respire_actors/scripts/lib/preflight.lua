-- Shared preflight helpers: run every check before the first write, because Redis does not
-- roll back writes made before a runtime error.

-- Fails with RESPIRE_WRONGTYPE unless `key` holds `expected` (or does not exist), or with
-- RESPIRE_NOPERM naming TYPE when the ACL user may not run TYPE on it (checked first: a TYPE
-- refused inside the script would raise an error that, on Redis 7.0, names no command).
local function respire_expect_type(key, expected)
  if not redis.acl_check_cmd('TYPE', key) then
    return redis.error_reply('RESPIRE_NOPERM the ACL user may not run TYPE on ' .. key)
  end
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= expected then
    return redis.error_reply('RESPIRE_WRONGTYPE ' .. key .. ' holds a ' .. t .. ', expected ' .. expected)
  end
  return nil
end

-- Commands whose permission is granted per subcommand (`+xgroup|create`): a refusal names both.
local RESPIRE_CONTAINERS = {XGROUP = true, XINFO = true, OBJECT = true, CLIENT = true}

-- Fails with RESPIRE_NOPERM unless the current ACL user may run the command (Redis 7.0+),
-- naming the permission as ACL SETUSER spells it ("xgroup|create") and the key.
local function respire_expect_perm(...)
  if not redis.acl_check_cmd(...) then
    local args = {...}
    local name, key = args[1], args[2]
    if RESPIRE_CONTAINERS[string.upper(name)] and args[2] then
      name, key = string.lower(name) .. '|' .. string.lower(tostring(args[2])), args[3]
    end
    local on = key and (' on ' .. tostring(key)) or ''
    return redis.error_reply('RESPIRE_NOPERM the ACL user may not run ' .. name .. on)
  end
  return nil
end

-- Checks a list of {key, type} pairs and a list of {cmd, key, ...} permission probes.
local function respire_preflight(types, perms)
  for _, pair in ipairs(types) do
    local err = respire_expect_type(pair[1], pair[2])
    if err then return err end
  end
  for _, probe in ipairs(perms) do
    local err = respire_expect_perm(unpack(probe))
    if err then return err end
  end
  return nil
end

-- Arguments of a scheduled enqueue (job_schedule, job_schedule_group), as numbers: the
-- deduplication window (1 .. 2^31-1 ms), delay and time to live (0 .. 2^31-1 ms) and a 32-bit
-- priority. Returns nil, or the RESPIRE_ARGUMENT error to return.
local function respire_check_schedule_args(window, delay, priority, ttl)
  local max = 2147483647
  if not window or window < 1 or window > max or window % 1 ~= 0 then
    return redis.error_reply('RESPIRE_ARGUMENT deduplication window out of range')
  end
  if not delay or delay < 0 or delay > max or delay % 1 ~= 0 then
    return redis.error_reply('RESPIRE_ARGUMENT delay out of range')
  end
  if not priority or priority < -max - 1 or priority > max or priority % 1 ~= 0 then
    return redis.error_reply('RESPIRE_ARGUMENT priority must be a 32-bit integer')
  end
  if not ttl or ttl < 0 or ttl > max or ttl % 1 ~= 0 then
    return redis.error_reply('RESPIRE_ARGUMENT time to live out of range')
  end
  return nil
end
