-- batch_remove: delete a completed batch's state (and with it the reservation of its id).
--
-- KEYS[1]  batch state
-- ARGV[1]  batch id
--
-- Only a completed batch (sealed, nothing pending, callbacks published) is removed; stream
-- entries, callbacks and events keep their own retention. A removed id can be created again.
-- Returns 'removed', 'absent' (no such batch) or 'active' (not completed; nothing changed).
-- Errors: RESPIRE_ARGUMENT, RESPIRE_WRONGTYPE, RESPIRE_NOPERM, RESPIRE_SCHEMA, RESPIRE_CORRUPT,
-- all without deleting anything.
--!include lib/preflight.lua
--!include lib/batch.lua

local state = KEYS[1]
if #ARGV ~= 1 or ARGV[1] == '' then
  return redis.error_reply('RESPIRE_ARGUMENT batch_remove takes a batch id')
end
local _, s, err = respire_batch_load(state, ARGV[1])
if err then return err end
if not s then return 'absent' end
if not s.done then return 'active' end
err = respire_expect_perm('DEL', state)
if err then return err end
redis.call('DEL', state)
return 'removed'
