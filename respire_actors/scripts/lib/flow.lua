-- Parent/child job flows: the stored state, its limits and the completion transition.
-- PURE: these functions read (TYPE, GET) and compute; they never write. The admin scripts
-- (flow_enqueue, flow_results, flow_children, flow_remove) and the shared completion library
-- (lib/coordination.lua, through respire_flow_plan) do the writes.
-- Needs lib/preflight.lua included before it.
--
-- State (one STRING key per flow, cmsgpack; never a Lua nil inside a table). Every completion
-- rewrites it, so what changes is kept in flat per-node strings (one byte per node, indexed by
-- the node's 1-based breadth-first number; 256 nodes make every count and index fit a byte)
-- and what never changes is one nested blob decoded only when a parent is activated:
--   { v = 1, id = <flow id>, policy = 'fail-parent' | 'ignore' | 'continue',
--     n = <node count>, results = <sum of retained result bytes>,
--     status = <n chars: w waiting, r ready, c completed, C completed with a result, f failed>,
--     parent = <n bytes: the parent's index, 0 for the root (node 1)>,
--     open = <n bytes: direct children not terminal yet>,
--     failed = <n bytes: direct children that failed>,
--     result = { [i] = <retained result, '' without one> },
--     static = <cmsgpack of { ids = { [i] = job id }, payloads = { [i] = payload of a parent,
--               '' for a leaf (leaves' payloads live only in their stream entries) } }> }
-- A parent's index is smaller than its children's (breadth-first order).

local RESPIRE_FLOW_VERSION = 1
local RESPIRE_FLOW_MAX_NODES = 256
local RESPIRE_FLOW_MAX_RESULT = 4096              -- one node's result
local RESPIRE_FLOW_MAX_RESULTS = 1048576          -- all retained results of a flow
local RESPIRE_FLOW_MAX_INPUT = 262144             -- job ids + payloads of a flow
local RESPIRE_FLOW_MAX_META = 262144 + 65536      -- stored state minus results: the input plus
                                                  -- bookkeeping (ids, statuses, tree shape)
local RESPIRE_FLOW_STATUS = {w = 'waiting', r = 'ready', c = 'completed', C = 'completed',
                             f = 'failed'}

local function respire_flow_limit(message)
  return redis.error_reply('RESPIRE_FLOW_LIMIT ' .. message)
end

local function respire_flow_corrupt(message)
  return redis.error_reply('RESPIRE_CORRUPT ' .. message)
end

-- One byte / character of a per-node string, and a copy with it replaced.
local function respire_flow_byte(s, i) return string.byte(s, i) end
local function respire_flow_put(s, i, ch)
  return string.sub(s, 1, i - 1) .. ch .. string.sub(s, i + 1)
end

-- Decodes a stored state and checks its version and identity.
-- Returns the state, or nil and an error reply (RESPIRE_SCHEMA for an unknown version,
-- RESPIRE_CORRUPT for anything unreadable).
local function respire_flow_decode(raw, flow_id)
  local ok, st = pcall(cmsgpack.unpack, raw)
  if not ok or type(st) ~= 'table' then
    return nil, respire_flow_corrupt('the flow state is not readable')
  end
  if st.v ~= RESPIRE_FLOW_VERSION then
    return nil, redis.error_reply('RESPIRE_SCHEMA flow state version ' .. tostring(st.v) ..
                                  ' is not supported (this version reads ' ..
                                  RESPIRE_FLOW_VERSION .. ')')
  end
  local n = st.n
  if st.id ~= flow_id or type(n) ~= 'number' or type(st.results) ~= 'number'
     or type(st.status) ~= 'string' or #st.status ~= n or type(st.parent) ~= 'string'
     or #st.parent ~= n or type(st.open) ~= 'string' or #st.open ~= n
     or type(st.failed) ~= 'string' or #st.failed ~= n or type(st.result) ~= 'table'
     or type(st.static) ~= 'string' then
    return nil, respire_flow_corrupt('the flow state does not belong to this flow')
  end
  return st, nil
end

-- The never-changing part of a state: {ids = {...}, payloads = {...}}.
local function respire_flow_static(st)
  local ok, s = pcall(cmsgpack.unpack, st.static)
  if not ok or type(s) ~= 'table' or type(s.ids) ~= 'table' or #s.ids ~= st.n
     or type(s.payloads) ~= 'table' then
    return nil, respire_flow_corrupt('the flow tree is not readable')
  end
  return s, nil
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

-- The ready-stream envelope of node i (`static` from respire_flow_static, or built by the
-- enqueue; `payload` overrides the static payload, for leaves).
local function respire_flow_envelope(st, static, i, payload)
  return {'_respire.job.id', static.ids[i], '_respire.job.payload', payload or static.payloads[i],
          '_respire.flow', st.id, '_respire.flow.node', tostring(i)}
end

-- The status name ('waiting', 'ready', 'completed', 'failed') of node i, and its result (nil
-- without one).
local function respire_flow_node(st, i)
  local ch = string.sub(st.status, i, i)
  local result = nil
  if ch == 'C' then result = st.result[i] end
  return RESPIRE_FLOW_STATUS[ch], result
end

-- The completion transition of one flow node, as a plan for lib/coordination.lua.
-- c: { id = <flow id>, node = <1-based index, number or string>, key = <state key> }
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
  if not index or index < 1 or index > st.n or index % 1 ~= 0 then
    return nil, respire_flow_corrupt('flow node ' .. tostring(c.node) .. ' is not in the flow')
  end
  if string.sub(st.status, index, index) ~= 'r' then return nil, nil end
  local failed = outcome ~= 'completed'
  if failed then
    st.status = respire_flow_put(st.status, index, 'f')
  elseif result ~= nil then
    if #result > RESPIRE_FLOW_MAX_RESULT then
      return nil, respire_flow_limit('a result is ' .. #result .. ' bytes; the limit is ' ..
                                     RESPIRE_FLOW_MAX_RESULT)
    end
    st.status = respire_flow_put(st.status, index, 'C')
    st.result[index] = result
    st.results = st.results + #result
  else
    st.status = respire_flow_put(st.status, index, 'c')
  end
  local ready, events, static = {}, {}, nil
  local at = respire_flow_byte(st.parent, index)
  while at > 0 do
    if string.sub(st.status, at, at) ~= 'w' then
      return nil, respire_flow_corrupt('flow node ' .. at .. ' is not waiting')
    end
    local open = respire_flow_byte(st.open, at) - 1
    if open < 0 then return nil, respire_flow_corrupt('flow node ' .. at .. ' has no open child') end
    st.open = respire_flow_put(st.open, at, string.char(open))
    if failed then
      st.failed = respire_flow_put(st.failed, at, string.char(respire_flow_byte(st.failed, at) + 1))
    end
    if open > 0 then break end
    if not static then
      static, err = respire_flow_static(st)
      if not static then return nil, err end
    end
    if respire_flow_byte(st.failed, at) > 0 and st.policy == 'fail-parent' then
      st.status = respire_flow_put(st.status, at, 'f')
      events[#events + 1] = {'kind', 'dead-letter', 'job_id', static.ids[at], 'entry_id', '0-0',
                             'attempt', '0', 'reason', 'child-failed', 'flow', st.id}
      failed = true  -- the grandparent sees a failed child
      at = respire_flow_byte(st.parent, at)
    else
      st.status = respire_flow_put(st.status, at, 'r')
      ready[#ready + 1] = respire_flow_envelope(st, static, at)
      break
    end
  end
  local new
  new, err = respire_flow_encode(st)
  if not new then return nil, err end
  return {key = c.key, old = raw, new = new, ready = ready, events = events}, nil
end
