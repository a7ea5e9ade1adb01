-- flow_enqueue: store a flow's tree and append its leaves to the ready stream, unless the
-- flow id already exists (flow ids deduplicate permanently, until flow_remove).
--
-- KEYS[1]  ready stream
-- KEYS[2]  flow state (:flow:<sha1 of the flow id>, a string)
-- KEYS[3]  coordination marker (:coordinated, a string; set once, never deleted)
-- KEYS[4]  control hash (its max_backlog field is the optional backlog bound)
-- KEYS[5]  staging stream (:scheduled; counted in the backlog)
-- ARGV[1]  flow id
-- ARGV[2]  failure policy: 'fail-parent', 'ignore' or 'continue'
-- ARGV[3]  n, the number of nodes (1 .. 256); then n groups of 3 values in breadth-first
--          order: job id, parent index (0 for node 1, the root; else 1 .. own index - 1, never
--          decreasing from one node to the next), encoded payload
-- ARGV[4..] the nodes above
--
-- Each leaf is appended as {_respire.job.id, _respire.job.payload, _respire.flow = flow id,
-- _respire.flow.node = its index}; parents wait in the state until their last child is
-- terminal (the completion scripts activate them through lib/coordination.lua).
-- Returns 1 when the flow was created, 0 when the flow id exists (nothing changed; the first
-- tree wins).
-- Errors (nothing written): RESPIRE_FULL (the backlog bound cannot take every node of the
-- tree, see lib/backlog.lua), RESPIRE_ARGUMENT (malformed tree, duplicate job id),
-- RESPIRE_FLOW_LIMIT (ids + payloads over 256 KiB, state too large), RESPIRE_SCHEMA (an
-- existing state of an unknown version), RESPIRE_CORRUPT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM.
-- Should an append or the SET of the state fail after the first write, the appended leaves are
-- deleted again before RESPIRE_FLOW_ENQUEUE is returned (the marker, harmless, stays).
--!include lib/preflight.lua
--!include lib/backlog.lua
--!include lib/flow.lua

local ready, state_key, marker, control, scheduled = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local flow_id, policy, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local function bad(message) return redis.error_reply('RESPIRE_ARGUMENT ' .. message) end
if policy ~= 'fail-parent' and policy ~= 'ignore' and policy ~= 'continue' then
  return bad('unknown failure policy')
end
if flow_id == '' or #flow_id > 1024 then return bad('flow id must be 1 to 1024 bytes') end
if not n or n < 1 or n > RESPIRE_FLOW_MAX_NODES or n % 1 ~= 0 or #ARGV ~= 3 + n * 3 then
  return bad('a flow has 1 to ' .. RESPIRE_FLOW_MAX_NODES .. ' nodes')
end

local ids, payloads, parents, seen, children, input = {}, {}, {}, {}, {}, 0
local last_parent = 0
for i = 1, n do
  local base = 4 + (i - 1) * 3
  local id, parent, payload = ARGV[base], tonumber(ARGV[base + 1]), ARGV[base + 2]
  if id == '' or #id > 1024 then return bad('job ids must be 1 to 1024 bytes') end
  if seen[id] then return bad('job id ' .. id .. ' appears twice in the flow') end
  seen[id] = true
  if i == 1 then
    if parent ~= 0 then return bad('node 1 is the root') end
  elseif not parent or parent % 1 ~= 0 or parent < last_parent or parent < 1 or parent >= i then
    return bad('node ' .. i .. ' is not in breadth-first order')
  end
  last_parent = parent
  input = input + #id + #payload
  ids[i], payloads[i], parents[i] = id, payload, string.char(parent)
  if parent > 0 then children[parent] = (children[parent] or 0) + 1 end
end
if input > RESPIRE_FLOW_MAX_INPUT then
  return respire_flow_limit('job ids and payloads are ' .. input .. ' bytes; the limit is ' ..
                            RESPIRE_FLOW_MAX_INPUT)
end

local existing, err = respire_flow_load(state_key, flow_id)
if err then return err end
if existing then return 0 end
err = respire_backlog_refusal(control, ready, scheduled, n)
if err then return err end

-- Leaves are appended now; their payloads are not kept in the state.
local status, open, results, leaves = {}, {}, {}, {}
local static = {ids = ids, payloads = payloads}
for i = 1, n do
  local k = children[i] or 0
  open[i] = string.char(k)
  results[i] = ''
  if k > 0 then
    status[i] = 'w'
  else
    status[i] = 'r'
    leaves[#leaves + 1] = i
  end
end
local st = {v = RESPIRE_FLOW_VERSION, id = flow_id, policy = policy, n = n, results = 0,
            status = table.concat(status), parent = table.concat(parents),
            open = table.concat(open), failed = string.rep(string.char(0), n), result = results}
local envelopes = {}
for j, i in ipairs(leaves) do
  envelopes[j] = respire_flow_envelope(st, static, i)
  payloads[i] = ''
end
st.static = cmsgpack.pack(static)
local raw
raw, err = respire_flow_encode(st)
if not raw then return err end

err = respire_preflight(
  {{ready, 'stream'}, {marker, 'string'}},
  {{'XADD', ready, '*', 'f', 'v'}, {'XDEL', ready, '0-1'}, {'SET', state_key, 'v'},
   {'EXISTS', marker}, {'SET', marker, '1'}})
if err then return err end

if redis.call('EXISTS', marker) == 0 then redis.call('SET', marker, '1') end
local appended = {}
local function undo(message, cause)
  for _, id in ipairs(appended) do redis.call('XDEL', ready, id) end
  return redis.error_reply('RESPIRE_FLOW_ENQUEUE ' .. message .. ': ' .. tostring(cause))
end
for _, fields in ipairs(envelopes) do
  local ok, id = pcall(redis.call, 'XADD', ready, '*', unpack(fields))
  if not ok then return undo('appending a leaf failed', id) end
  appended[#appended + 1] = id
end
local ok, setErr = pcall(redis.call, 'SET', state_key, raw)
if not ok then return undo('storing the flow state failed', setErr) end
return 1
