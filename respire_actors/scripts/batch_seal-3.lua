-- batch_seal: seal a batch (no new members), or seal it and request its cancellation.
--
-- KEYS[1]  batch state
-- KEYS[2]  ready stream (callbacks are appended here)
-- KEYS[3]  events stream
-- ARGV[1]  mode: 'seal' or 'cancel'
-- ARGV[2]  batch id
--
-- 'cancel' also records the cancellation request: workers acknowledge members they have not
-- started as cancelled, and every member completing from now on counts as cancelled (running
-- handlers are not interrupted). A completed batch is left unchanged. When the batch is sealed
-- with nothing pending (an empty batch, or every member already finished), this script
-- completes it as a member's completion would: it publishes on_success (all succeeded, no
-- cancellation request) or on_failure, then on_complete, and a batch-completed event, together
-- with the new state.
-- Returns 'changed' (sealed now, or cancellation requested now), 'completed' (changed, and the
-- callbacks were published), 'unchanged' (already sealed / cancelled, or completed) or 'unknown'
-- (no such batch; nothing written).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM, RESPIRE_SCHEMA, RESPIRE_CORRUPT
-- before any write. Should a write fail half-way, the appended callbacks and event are deleted,
-- the old state is restored and RESPIRE_COORDINATION is returned (lib/coordination.lua writes
-- and compensates, as for a member's completion).
--!include lib/preflight.lua
--!include lib/fence.lua
--!include lib/coordination.lua

local state, ready, events = KEYS[1], KEYS[2], KEYS[3]
local mode, id = ARGV[1], ARGV[2]
if #ARGV ~= 2 or (mode ~= 'seal' and mode ~= 'cancel') or id == '' then
  return redis.error_reply('RESPIRE_ARGUMENT batch_seal takes seal or cancel and a batch id')
end
local raw, s, err = respire_batch_load(state, id)
if err then return err end
if not s then return 'unknown' end
if s.done or (s.sealed and (mode == 'seal' or s.cancel)) then return 'unchanged' end
s.sealed = true
if mode == 'cancel' then s.cancel = true end
local plan = {key = state, old = raw, ready = {}, events = {}}
local completed = respire_batch_finish(s, plan.ready, plan.events)
plan.new = respire_batch_encode(s)
err = respire_preflight({{ready, 'stream'}, {events, 'stream'}},
                        {{'SET', state, 'v'}, {'XADD', ready, '*', 'f', 'v'},
                         {'XDEL', ready, '0-1'}, {'XADD', events, '*', 'f', 'v'},
                         {'XDEL', events, '0-1'}})
if err then return err end
local _, aerr = respire_coord_apply(ready, events, plan)
if aerr then return aerr end
if completed then return 'completed' end
return 'changed'
