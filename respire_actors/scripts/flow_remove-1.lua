-- flow_remove: delete a finished flow's state, which also releases its flow id.
--
-- KEYS[1]  flow state (:flow:<sha1 of the flow id>)
-- ARGV[1]  flow id
--
-- Returns 1 when removed, 0 when there is no such flow.
-- Errors (nothing deleted): RESPIRE_FLOW_ACTIVE when a node is still waiting or ready,
-- RESPIRE_SCHEMA (unknown state version), RESPIRE_CORRUPT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM.
--!include lib/preflight.lua
--!include lib/flow.lua

local key = KEYS[1]
local st, err = respire_flow_load(key, ARGV[1])
if err then return err end
if not st then return 0 end
local active = string.find(st.status, '[wr]')
if active then
  return redis.error_reply('RESPIRE_FLOW_ACTIVE node ' .. active .. ' is ' ..
                           respire_flow_node(st, active))
end
err = respire_expect_perm('DEL', key)
if err then return err end
redis.call('DEL', key)
return 1
