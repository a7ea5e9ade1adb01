-- Parent/child job flows: the stored state, its limits and the completion transition.
-- PURE: these functions read (GET) and compute; they never write. The admin scripts
-- (flow_enqueue, flow_results, flow_children, flow_remove) and the shared completion library
-- (lib/coordination.lua, through respire_flow_plan) do the writes.
-- Needs lib/preflight.lua included before it.
--
-- State (one STRING key per flow, cmsgpack; never a Lua nil inside a table):
--   { v = 1, id = <flow id>, policy = 'fail-parent' | 'ignore' | 'continue',
--     results = <sum of retained result bytes>,
--     nodes = { [i] = { id = <job id>, parent = <index, 0 for the root>,
--                       status = 'waiting' | 'ready' | 'completed' | 'failed',
--                       open = <direct children not terminal yet>,
--                       failed = <direct children that failed>,
--                       has_result = <bool>, result = <bytes, '' without one>,
--                       payload = <bytes of a waiting parent; '' once it was activated> } } }
-- Nodes are numbered 1..n in breadth-first order (the root is 1; a parent's index is smaller
-- than its children's). Leaves' payloads go straight to the ready stream and are not kept.

local RESPIRE_FLOW_VERSION = 1
local RESPIRE_FLOW_MAX_NODES = 256
local RESPIRE_FLOW_MAX_RESULT = 4096              -- one node's result
local RESPIRE_FLOW_MAX_RESULTS = 1048576          -- all retained results of a flow
local RESPIRE_FLOW_MAX_INPUT = 262144             -- job ids + payloads of a flow
local RESPIRE_FLOW_MAX_META = 262144 + 65536      -- stored state minus results: the input plus
                                                  -- bookkeeping (ids, statuses, tree shape)

local function respire_flow_limit(message)
  return redis.error_reply('RESPIRE_FLOW_LIMIT ' .. message)
end

-- Decodes a stored state and checks its version and identity.
-- Returns the state, or nil and an error reply (RESPIRE_SCHEMA for an unknown version,
-- RESPIRE_CORRUPT for anything unreadable).
local function respire_flow_decode(raw, flow_id)
  local ok, st = pcall(cmsgpack.unpack, raw)
  if not ok or type(st) ~= 'table' then
    return nil, redis.error_reply('RESPIRE_CORRUPT the flow state is not readable')
  end
  if st.v ~= RESPIRE_FLOW_VERSION then
    return nil, redis.error_reply('RESPIRE_SCHEMA flow state version ' .. tostring(st.v) ..
                                  ' is not supported (this version reads ' ..
                                  RESPIRE_FLOW_VERSION .. ')')
  end
  if st.id ~= flow_id or type(st.nodes) ~= 'table' or type(st.results) ~= 'number' then
    return nil, redis.error_reply('RESPIRE_CORRUPT the flow state does not belong to this flow')
  end
  return st, nil
end

-- Reads and decodes the state at `key` (a type check first: TYPE, then GET).
-- Returns state, nil, raw | nil, nil (absent) | nil, error reply.
local function respire_flow_load(key, flow_id)
  local err = respire_expect_type(key, 'string')
  if err then return nil, err end
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    return nil, respire_expect_perm('GET', key) or redis.error_reply(raw.err)
  end
  if not raw then return nil, nil end
  local st
  st, err = respire_flow_decode(raw, flow_id)
  if not st then return nil, err end
  return st, nil, raw
end

-- Encodes a state, checking the retained-tree limits. Returns the string, or nil and an error.
local function respire_flow_encode(st)
  if st.results > RESPIRE_FLOW_MAX_RESULTS then
    return nil, respire_flow_limit('the flow would retain ' .. st.results ..
                                   ' bytes of results; the limit is ' .. RESPIRE_FLOW_MAX_RESULTS)
  end
  local raw = cmsgpack.pack(st)
  if #raw - st.results > RESPIRE_FLOW_MAX_META then
    return nil, respire_flow_limit('the flow state would hold ' .. (#raw - st.results) ..
                                   ' bytes besides results; the limit is ' .. RESPIRE_FLOW_MAX_META)
  end
  return raw, nil
end

-- The ready-stream envelope of node i (its payload must still be in the state).
local function respire_flow_envelope(st, i)
  local node = st.nodes[i]
  return {'_respire.job.id', node.id, '_respire.job.payload', node.payload,
          '_respire.flow', st.id, '_respire.flow.node', tostring(i)}
end

-- True when node i is completed or failed.
local function respire_flow_terminal(node)
  return node.status == 'completed' or node.status == 'failed'
end

-- The completion transition of one flow node, as a plan for lib/coordination.lua.
-- c: { id = <flow id>, node = <1-based index, number or string>, key = <state key>,
--      job_id = <the entry's job id, optional> }
-- outcome: 'completed' | 'failed' | 'cancelled' (cancelled counts as failed); result: the
-- bytes a completed node retains, or nil for none.
-- Returns nil, nil when there is nothing to coordinate (the flow was removed, or the node is
-- not 'ready' any more: a replay of a dead letter runs as an independent job); nil and an error
-- reply (RESPIRE_SCHEMA, RESPIRE_CORRUPT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM,
-- RESPIRE_FLOW_LIMIT, RESPIRE_ARGUMENT) before anything is written; else the plan
-- { key, old, new, ready = {envelope...}, events = {fields...} }: the node becomes terminal,
-- each ancestor whose last open child this was either becomes ready (its envelope is in
-- `ready`) or, under 'fail-parent' with a failed child, fails without running (a dead-letter
-- event with reason child-failed, entry id 0-0, attempt 0 in `events`) and passes the failure
-- on to its own parent.
local function respire_flow_plan(c, outcome, result)
  if outcome ~= 'completed' and outcome ~= 'failed' and outcome ~= 'cancelled' then
    return nil, redis.error_reply('RESPIRE_ARGUMENT unknown flow outcome ' .. tostring(outcome))
  end
  local st, err, raw = respire_flow_load(c.key, c.id)
  if err then return nil, err end
  if not st then return nil, nil end
  local index = tonumber(c.node)
  local node = index and st.nodes[index]
  if not node or (c.job_id and node.id ~= c.job_id) then
    return nil, redis.error_reply('RESPIRE_CORRUPT flow node ' .. tostring(c.node) ..
                                  ' does not match the flow state')
  end
  if node.status ~= 'ready' then return nil, nil end
  if outcome == 'completed' then
    node.status = 'completed'
    if result ~= nil then
      if #result > RESPIRE_FLOW_MAX_RESULT then
        return nil, respire_flow_limit('a result is ' .. #result .. ' bytes; the limit is ' ..
                                       RESPIRE_FLOW_MAX_RESULT)
      end
      node.has_result = true
      node.result = result
      st.results = st.results + #result
    end
  else
    node.status = 'failed'
  end
  local ready, events = {}, {}
  local child = node
  while child.parent > 0 do
    local at = child.parent
    local parent = st.nodes[at]
    if not parent or parent.status ~= 'waiting' then
      return nil, redis.error_reply('RESPIRE_CORRUPT flow node ' .. at .. ' is not waiting')
    end
    parent.open = parent.open - 1
    if child.status == 'failed' then parent.failed = parent.failed + 1 end
    if parent.open > 0 then break end
    if parent.failed > 0 and st.policy == 'fail-parent' then
      parent.status = 'failed'
      parent.payload = ''
      events[#events + 1] = {'kind', 'dead-letter', 'job_id', parent.id, 'entry_id', '0-0',
                             'attempt', '0', 'reason', 'child-failed', 'flow', st.id}
      child = parent
    else
      parent.status = 'ready'
      ready[#ready + 1] = respire_flow_envelope(st, at)
      parent.payload = ''
      break
    end
  end
  local new
  new, err = respire_flow_encode(st)
  if not new then return nil, err end
  return {key = c.key, old = raw, new = new, ready = ready, events = events}, nil
end
