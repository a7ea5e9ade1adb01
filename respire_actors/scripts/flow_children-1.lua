-- flow_children: the direct children of one flow node, as its handler should see them.
--
-- KEYS[1]  flow state (:flow:<sha1 of the flow id>)
-- ARGV[1]  flow id
-- ARGV[2]  node index (1-based, breadth-first; _respire.flow.node of the entry)
-- ARGV[3]  the node's job id (checked against the state)
--
-- Returns {0} when the flow state is gone (removed), else {1, {job id, status, has result
-- (1 | 0), result}...} in breadth-first order. Under the 'ignore' policy failed children are
-- left out; under 'continue' they are included with status 'failed' and no result; under
-- 'fail-parent' a parent only runs when every child completed.
-- Errors (read only): RESPIRE_ARGUMENT, RESPIRE_SCHEMA, RESPIRE_CORRUPT (the node does not
-- match the state), RESPIRE_WRONGTYPE, RESPIRE_NOPERM.
--!include lib/preflight.lua
--!include lib/flow.lua

local index = tonumber(ARGV[2])
if not index or index < 1 or index % 1 ~= 0 then
  return redis.error_reply('RESPIRE_ARGUMENT bad flow node index')
end
local st, err = respire_flow_load(KEYS[1], ARGV[1])
if err then return err end
if not st then return {0} end
if index > st.n then
  return redis.error_reply('RESPIRE_CORRUPT flow node ' .. index .. ' is not in the flow')
end
local static
static, err = respire_flow_static(st)
if not static then return err end
if static.ids[index] ~= ARGV[3] then
  return redis.error_reply('RESPIRE_CORRUPT flow node ' .. index .. ' does not match the state')
end
local out = {}
for i = index + 1, st.n do
  if respire_flow_byte(st.parent, i) == index then
    local status, result = respire_flow_node(st, i)
    if not (status == 'failed' and st.policy == 'ignore') then
      out[#out + 1] = {static.ids[i], status, result and 1 or 0, result or ''}
    end
  end
end
return {1, out}
