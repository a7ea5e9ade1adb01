-- Delivery fencing: a delivery is current only while its entry is pending for the same consumer
-- with the same delivery count. A slow handler whose entry was recovered by another consumer (or
-- re-delivered to this one) fails the fence and can no longer complete or report.
local function respire_fence(ready, group, entry, consumer, attempt)
  local rows = redis.call('XPENDING', ready, group, entry, entry, 1)
  local row = rows[1]
  if not row then return false end
  return row[2] == consumer and tonumber(row[4]) == tonumber(attempt)
end

-- Reads the fields of one entry as a flat array, or nil when the body was deleted.
local function respire_entry(stream, id)
  local rows = redis.call('XRANGE', stream, id, id)
  if rows[1] then return rows[1][2] end
  return nil
end

local function respire_field(fields, name)
  if not fields then return nil end
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end

-- The server clock in unix milliseconds (Redis TIME; never the application's clock).
local function respire_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- True when the envelope carries an absolute expiry (_respire.job.expires_at, unix ms) that has
-- passed at `now`. `now` is a function so the clock is read only for entries that have a TTL.
local function respire_expired(fields, now)
  local at = tonumber(respire_field(fields, '_respire.job.expires_at') or '')
  return at ~= nil and at > 0 and now() >= at
end

-- Acknowledgement modes: 'ack' (XACK; the body stays for trimming), 'xdel' (XACK then XDEL:
-- delete-acknowledged-entries on servers without XACKDEL), 'ackdel' (Redis 8.2+: XACKDEL ACKED,
-- deleting the body once every consumer group has acknowledged it).
local function respire_ack_mode_ok(mode)
  return mode == 'ack' or mode == 'xdel' or mode == 'ackdel'
end

-- The ACL probes an acknowledgement in `mode` needs (appended to a preflight list).
local function respire_ack_probes(probes, ready, group, mode)
  probes[#probes + 1] = {'XACK', ready, group, '0-1'}
  if mode == 'xdel' then probes[#probes + 1] = {'XDEL', ready, '0-1'} end
  if mode == 'ackdel' then
    probes[#probes + 1] = {'XACKDEL', ready, group, 'ACKED', 'IDS', '1', '0-1'}
  end
  return probes
end

-- Acknowledges one entry of `ready` in `mode` (see respire_ack_mode_ok).
local function respire_ack(ready, group, mode, id)
  if mode == 'ackdel' then
    redis.call('XACKDEL', ready, group, 'ACKED', 'IDS', 1, id)
  else
    redis.call('XACK', ready, group, id)
    if mode == 'xdel' then redis.call('XDEL', ready, id) end
  end
end

-- Queue admission, checked atomically with every claim: the persistent pause flag, then the
-- fixed-window rate limit on the server clock. Windows are aligned to multiples of the window
-- length since the unix epoch; usage is (rate.window_start, rate.used) in the control hash and
-- counts one permit per delivered entry.
-- Returns 'paused', 0 | 'limited', ms until the window ends | 'ok', how many of `wanted` may be
-- admitted, and the window state to pass to respire_admit_commit (nil when no policy is set).
-- A denial increments the cumulative rate_limit_hits counter (its only write).
local function respire_admit(control, wanted)
  local c = redis.call('HMGET', control, 'paused', 'rate.limit', 'rate.window',
                       'rate.window_start', 'rate.used')
  if c[1] == '1' then return 'paused', 0, nil end
  local limit, window = tonumber(c[2] or ''), tonumber(c[3] or '')
  if not limit or not window or window < 1 then return 'ok', wanted, nil end
  local now = respire_now_ms()
  local start = now - (now % window)
  local used = 0
  if tonumber(c[4] or '') == start then used = tonumber(c[5] or '0') or 0 end
  if used >= limit then
    redis.call('HINCRBY', control, 'rate_limit_hits', 1)
    return 'limited', start + window - now, nil
  end
  local allowed = limit - used
  if wanted < allowed then allowed = wanted end
  return 'ok', allowed, {start, used}
end

-- The ACL probes an admission that may record usage needs.
local function respire_admit_probes(probes, control, state)
  if state then probes[#probes + 1] = {'HSET', control, 'rate.used', '0'} end
  return probes
end

-- Records `n` admissions in the current window (no-op without a policy or for n = 0).
local function respire_admit_commit(control, state, n)
  if state and n > 0 then
    redis.call('HSET', control, 'rate.window_start', state[1], 'rate.used', state[2] + n)
  end
end
