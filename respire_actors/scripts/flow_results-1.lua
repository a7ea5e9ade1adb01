-- flow_results: every node of a flow, in breadth-first order, with its status and result.
--
-- KEYS[1]  flow state (:flow:<sha1 of the flow id>)
-- ARGV[1]  flow id
--
-- Returns {} for an unknown (or removed) flow, else one {job id, status, parent index (0 for
-- the root), has result (1 | 0), result ('' without one)} per node; status is 'waiting'
-- (children not all terminal), 'ready' (queued, running, pending or retrying), 'completed' or
-- 'failed'.
-- Errors (read only): RESPIRE_SCHEMA (unknown state version), RESPIRE_CORRUPT,
-- RESPIRE_WRONGTYPE, RESPIRE_NOPERM.
--!include lib/preflight.lua
--!include lib/flow.lua

local st, err = respire_flow_load(KEYS[1], ARGV[1])
if err then return err end
if not st then return {} end
local static
static, err = respire_flow_static(st)
if not static then return err end
local out = {}
for i = 1, st.n do
  local status, result = respire_flow_node(st, i)
  out[i] = {static.ids[i], status, respire_flow_byte(st.parent, i), result and 1 or 0,
            result or ''}
end
return out
