-- Delivery fencing: a delivery is current only while its entry is pending for the same consumer
-- with the same delivery count. A slow handler whose entry was recovered by another consumer (or
-- re-delivered to this one) fails the fence and can no longer complete or report.
local function respire_fence(ready, group, entry, consumer, attempt)
  local rows = redis.call('XPENDING', ready, group, entry, entry, 1)
  local row = rows[1]
  if not row then return false end
  return row[2] == consumer and tonumber(row[4]) == tonumber(attempt)
end

-- The ACL probes of the reads a fenced transition repeats between its writes (the later outcomes
-- of a batch are fenced, and their bodies read, after the earlier ones were written): XPENDING
-- and XRANGE of the stream, and TIME (the server clock) when `clock` is true.
local function respire_fence_probes(probes, stream, clock)
  probes[#probes + 1] = {'XPENDING', stream, 'g', '-', '+', '1'}
  probes[#probes + 1] = {'XRANGE', stream, '-', '+', 'COUNT', '1'}
  if clock then probes[#probes + 1] = {'TIME'} end
  return probes
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

-- Acknowledgement: the caller says only whether acknowledged entries are kept ('ack': XACK, the
-- body stays for trimming) or deleted ('delete'); each script decides how to delete on the server
-- it runs on, per call, so a failover to a server without XACKDEL never breaks completions:
-- 'ackdel' (XACKDEL ACKED, Redis 8.2+: the body goes once every group has acknowledged it) where
-- the command exists, else 'xdel' (XACK then XDEL). respire_ack_mode returns the concrete mode,
-- or nil and an error reply for an unknown argument or an ACL user denied an existing XACKDEL
-- (falling back to group-unaware XDEL there would be a silent change of semantics).
local function respire_ack_mode(ready, group, requested)
  if requested == 'ack' then return 'ack', nil end
  if requested ~= 'delete' then
    return nil, redis.error_reply('RESPIRE_ARGUMENT acknowledgement must be ack or delete')
  end
  -- acl_check_cmd raises for a command the server does not know, returns false when denied.
  local known, allowed = pcall(redis.acl_check_cmd, 'XACKDEL', ready, group, 'ACKED', 'IDS',
                               '1', '0-1')
  if not known then return 'xdel', nil end
  if allowed then return 'ackdel', nil end
  return nil, redis.error_reply('RESPIRE_NOPERM the ACL user may not run XACKDEL on ' .. ready)
end

-- The arguments job_read and job_select share: how many entries to admit (1 .. 1000), the
-- acknowledgement ('ack' or 'delete', see respire_ack_mode) and the minimum idle time (ms) of
-- an entry recovery should claim first. Returns count, concrete mode, min_idle; or nil and the
-- error reply to return.
local function respire_read_args(ready, group, count_arg, ack_arg, idle_arg)
  local count = tonumber(count_arg)
  if not count or count < 1 or count > 1000 then
    return nil, redis.error_reply('RESPIRE_ARGUMENT read count out of range')
  end
  local mode, merr = respire_ack_mode(ready, group, ack_arg or 'ack')
  if not mode then return nil, merr end
  local min_idle = tonumber(idle_arg or '0')
  if not min_idle or min_idle < 0 then
    return nil, redis.error_reply('RESPIRE_ARGUMENT minimum idle time out of range')
  end
  return count, mode, min_idle
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

-- Acknowledges one entry of `ready` in a concrete `mode` from respire_ack_mode.
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
  return 'ok', allowed, {start, used, limit, window}
end

-- Under a rate policy (state from respire_admit), a reader takes at most a tenth of the window's
-- permits per call, and should wait `pace` ms before its next read: the share of the window its
-- permits stand for (a tenth for a full slice), so one busy process cannot take a whole window
-- in its first milliseconds and a worker joining a saturated queue gets turns, while a reader
-- taking fewer permits per call (a small read batch) still reaches the full rate. Returns the
-- capped count and the pace (0 without a policy).
local function respire_admit_slice(state, allowed)
  if not state then return allowed, 0 end
  local slice = math.ceil(state[3] / 10)
  if allowed > slice then allowed = slice end
  return allowed, math.ceil(state[4] * allowed / state[3])
end

-- Workers of one queue may be configured with different visibility timeouts (a rolling deploy
-- that changes it): an entry's lease is its idle time, so a worker with a shorter timeout would
-- claim the running, renewed jobs of one with a longer timeout (it renews only every third of
-- its own). So a worker that runs jobs records its timeout in the control hash as a heartbeat
-- (lease.ms, valid until lease.until on the server clock, 3 s from the last
-- mark: its reads, lease renewals, recovery passes, and a mark every second while it holds
-- running deliveries), and while a longer timeout than a caller's is recorded, recovery and
-- the rate policy's recover redirect wait for that one instead. A worker that died stops
-- marking: its timeout lapses within 3 s and the others recover its jobs by
-- their own timeout, as before.
-- Returns the minimum idle time to use (ms).
local function respire_lease_floor(control, min_idle)
  local r = redis.call('HMGET', control, 'lease.ms', 'lease.until')
  local ms, valid_until = tonumber(r[1] or ''), tonumber(r[2] or '')
  if ms and valid_until and ms > min_idle and valid_until > respire_now_ms() then return ms end
  return min_idle
end

-- Marks a worker's own visibility timeout `own` (see respire_lease_floor) unless a longer one
-- is recorded and still valid; the same one is refreshed once a third of its validity has
-- passed (so most calls only read). The caller preflights HSET on `control`.
local function respire_lease_record(control, own)
  if own <= 0 then return end
  local r = redis.call('HMGET', control, 'lease.ms', 'lease.until')
  local ms, valid_until = tonumber(r[1] or ''), tonumber(r[2] or '')
  local now = respire_now_ms()
  if ms and valid_until and valid_until > now then
    if ms > own then return end
    if ms == own and valid_until - now > 2000 then return end  -- marks last 3000 ms
  end
  redis.call('HSET', control, 'lease.ms', string.format('%d', own),
             'lease.until', string.format('%d', now + 3000))
end

-- Admission of a read (job_read, job_select): the queue's pause and rate limit, the read's slice
-- of the window, and, under a rate policy, recovery before new reads (while an entry is idle
-- past the visibility timeout, the reader is sent to recover it with its permits instead of
-- taking a new job). Returns the reply to return at once ('paused', 'limited', 'recover') or
-- nil, then how many entries may be admitted, the pace and the window state.
local function respire_read_admission(ready, control, group, count, min_idle)
  local status, allowed, window = respire_admit(control, count)
  if status == 'paused' then return {'paused'} end
  if status == 'limited' then return {'limited', allowed} end
  local pace
  allowed, pace = respire_admit_slice(window, allowed)
  if window and min_idle > 0 and redis.call('EXISTS', ready) == 1 then
    min_idle = respire_lease_floor(control, min_idle)
    local stale = redis.call('XPENDING', ready, group, 'IDLE', min_idle, '-', '+', 1)
    if stale[1] then return {'recover', stale[1][1], pace} end
  end
  return nil, allowed, pace, window
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
