-- Shared preflight helpers: run every check before the first write, because Redis does not
-- roll back writes made before a runtime error.

-- Fails with RESPIRE_WRONGTYPE unless `key` holds `expected` (or does not exist).
local function respire_expect_type(key, expected)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= expected then
    return redis.error_reply('RESPIRE_WRONGTYPE ' .. key .. ' holds a ' .. t .. ', expected ' .. expected)
  end
  return nil
end

-- Fails with RESPIRE_NOPERM unless the current ACL user may run the command (Redis 7.0+).
local function respire_expect_perm(...)
  if not redis.acl_check_cmd(...) then
    local args = {...}
    return redis.error_reply('RESPIRE_NOPERM the ACL user may not run ' .. args[1] .. ' on ' .. tostring(args[2]))
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
