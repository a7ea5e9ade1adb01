-- Coordination of flows and batches, shared by every script that finishes a ready-stream entry
-- (job_complete, job_finish, job_claim_pending): one place where coordination state changes,
-- always after the entry's fence held and in the same execution as its acknowledgement.
--
-- A member's body names its coordination: _respire.flow (flow id) and _respire.flow.node (its
-- 1-based breadth-first index), or _respire.batch (batch id). State keys are derived from the
-- ready key, so they share its hash tag (one cluster slot) and its client prefix:
--   <base>:flow:<sha1 of the flow id>    <base>:batch:<sha1 of the batch id>
--   <base>:coordinated                   marker: the queue has (had) flows or batches
-- where <base> is the ready key without ':ready'. Scripts read entry bodies for coordination only
-- when the marker exists, so queues that never used flows or batches pay one EXISTS per call.
--
-- Use:  c = respire_coord_of(ready, body)                      nil for an ordinary job
--       plan, err = respire_coord_plan(ready, events, c, outcome, result)   checks only
--       undo, err = respire_coord_apply(ready, events, plan)   the writes
--       respire_coord_undo(ready, events, undo)                when a later write fails
-- outcome is 'completed', 'failed' or 'cancelled'; result is the flow node's retained result
-- (a string) or nil. A nil plan without error means there is nothing to coordinate (the state was
-- removed, or the member is no longer pending: a dead-letter replay running as its own job).
--!include lib/flow.lua
--!include lib/batch.lua

local function respire_coord_base(ready)
  return string.sub(ready, 1, #ready - 6)
end

local function respire_coord_marked(ready)
  return redis.call('EXISTS', respire_coord_base(ready) .. ':coordinated') == 1
end

local function respire_coord_of(ready, body)
  if not body then return nil end
  local flow = respire_field(body, '_respire.flow')
  if flow then
    return {kind = 'flow', id = flow,
            key = respire_coord_base(ready) .. ':flow:' .. redis.sha1hex(flow),
            node = tonumber(respire_field(body, '_respire.flow.node') or '')}
  end
  local batch = respire_field(body, '_respire.batch')
  if batch then
    return {kind = 'batch', id = batch,
            key = respire_coord_base(ready) .. ':batch:' .. redis.sha1hex(batch),
            job_id = respire_field(body, '_respire.job.id') or ''}
  end
  return nil
end

-- Appends the member's coordination ('flow', id or 'batch', id) to an event's field list.
local function respire_coord_tag(c, fields)
  if c then
    fields[#fields + 1] = c.kind
    fields[#fields + 1] = c.id
  end
  return fields
end

-- An outcome kind of the completion scripts as a coordination outcome.
local function respire_coord_outcome(kind)
  if kind == 'ack' then return 'completed' end
  if kind == 'cancelled' then return 'cancelled' end
  return 'failed'
end

local function respire_coord_plan(ready, events, c, outcome, result)
  if not c then return nil, nil end
  local err = respire_preflight({{c.key, 'string'}},
    {{'GET', c.key}, {'SET', c.key, 'v'}, {'XADD', ready, '*', 'f', 'v'}, {'XDEL', ready, '0-1'},
     {'XADD', events, '*', 'f', 'v'}, {'XDEL', events, '0-1'}})
  if err then return nil, err end
  if c.kind == 'flow' then return respire_flow_plan(c, outcome, result) end
  return respire_batch_plan(c, outcome)
end

local function respire_coord_undo(ready, events, undo)
  if not undo then return end
  for _, id in ipairs(undo.events) do redis.call('XDEL', events, id) end
  for _, id in ipairs(undo.ready) do redis.call('XDEL', ready, id) end
  if undo.written then redis.call('SET', undo.key, undo.old) end
end

-- Writes a plan: the new state, then its ready entries and events in order. Should a write fail,
-- what it wrote is undone and nil plus an error reply is returned.
local function respire_coord_apply(ready, events, plan)
  if not plan then return nil, nil end
  local undo = {key = plan.key, old = plan.old, written = false, ready = {}, events = {}}
  local ok, werr = pcall(function()
    redis.call('SET', plan.key, plan.new)
    undo.written = true
    for _, f in ipairs(plan.ready or {}) do
      undo.ready[#undo.ready + 1] = redis.call('XADD', ready, '*', unpack(f))
    end
    for _, f in ipairs(plan.events or {}) do
      undo.events[#undo.events + 1] = redis.call('XADD', events, '*', unpack(f))
    end
  end)
  if not ok then
    respire_coord_undo(ready, events, undo)
    return nil, redis.error_reply('RESPIRE_COORDINATION writing ' .. plan.key .. ' failed: ' ..
                                  tostring(werr))
  end
  return undo, nil
end
