-- Producer backpressure: the optional bound on a job queue's backlog (docs/job-queue.md,
-- "Backpressure"). Needs lib/preflight.lua.
--
-- The backlog is every job the queue has accepted and not yet finished:
--   undelivered ready entries (the consumer group's lag; every entry while no group exists)
--   + delivered, unacknowledged entries (the group's pending count: running handlers and
--     expired leases awaiting recovery)
--   + staged entries (the :scheduled stream: delays, durable retries, grouped jobs).
-- Acknowledged entries kept for retention, dead letters and events do not count.
--
-- Cost: nothing but one HGET of the control hash when no bound is set. With a bound, XLEN of
-- the ready and staging streams is an upper bound of the backlog (acknowledged entries may
-- still be stored), so a queue well under its bound is admitted after two XLENs; only near the
-- bound is the exact figure read from XINFO GROUPS (pending and lag, O(1)). Where the server
-- cannot tell the lag (an XDEL at or after the group's last delivered id), the undelivered
-- entries are counted with one XRANGE bounded by the room left, so never more than the bound.

local RESPIRE_CONSUMER_GROUP = 'respire'

-- The stored bound (a positive integer) or nil; or nil and an error reply to return.
local function respire_backlog_limit(control)
  local limit = redis.pcall('HGET', control, 'max_backlog')
  if type(limit) == 'table' and limit.err then
    return nil, respire_expect_type(control, 'hash') or respire_expect_perm('HGET', control, 'f')
      or redis.error_reply(limit.err)
  end
  if not limit then return nil, nil end
  return tonumber(limit), nil
end

-- XLEN of a stream key; or nil and a permission or type error (nothing was written).
local function respire_backlog_len(key)
  if not redis.acl_check_cmd('XLEN', key) then return nil, respire_expect_perm('XLEN', key) end
  local n = redis.pcall('XLEN', key)
  if type(n) == 'table' and n.err then
    return nil, respire_expect_type(key, 'stream') or redis.error_reply(n.err)
  end
  return n, nil
end

-- The backlog of the queue; or nil and an error reply. Reads only. With a number `cap`, a
-- backlog over `cap` may be answered by an upper bound and an undelivered count the server
-- cannot give is counted by XRANGE only as far as `cap` needs; with `cap` nil the figure is
-- exact (that XRANGE is then unbounded: an observer's read, never an enqueue's).
local function respire_backlog_count(ready, scheduled, cap)
  local staged, stored, err
  staged, err = respire_backlog_len(scheduled)
  if err then return nil, err end
  stored, err = respire_backlog_len(ready)
  if err then return nil, err end
  if stored == 0 or (cap and stored + staged <= cap) then return stored + staged, nil end
  err = respire_preflight({}, {{'XINFO', 'GROUPS', ready},
                               {'XRANGE', ready, '-', '+', 'COUNT', '1'}})
  if err then return nil, err end
  for _, flat in ipairs(redis.call('XINFO', 'GROUPS', ready)) do
    local info = {}
    for i = 1, #flat, 2 do info[flat[i]] = flat[i + 1] end
    if info['name'] == RESPIRE_CONSUMER_GROUP then
      local pending, lag = tonumber(info['pending']), info['lag']
      if not lag then
        local room = cap and (cap - staged - pending + 1) or stored
        lag = 0
        if room > 0 then
          lag = #redis.call('XRANGE', ready, '(' .. info['last-delivered-id'], '+', 'COUNT', room)
        end
      end
      return staged + pending + tonumber(lag), nil
    end
  end
  return stored + staged, nil -- no consumer group yet: every stored entry waits
end

-- nil when `adding` more jobs fit under the queue's bound (or there is none); else the
-- RESPIRE_FULL error naming the backlog and the bound (or a type / permission error).
local function respire_backlog_refusal(control, ready, scheduled, adding)
  local limit, err = respire_backlog_limit(control)
  if err then return err end
  if not limit then return nil end
  local backlog
  backlog, err = respire_backlog_count(ready, scheduled, limit - adding)
  if err then return err end
  if backlog + adding <= limit then return nil end
  return redis.error_reply(string.format('RESPIRE_FULL backlog %d limit %d adding %d',
                                         backlog, limit, adding))
end
