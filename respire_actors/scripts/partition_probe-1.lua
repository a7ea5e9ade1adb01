-- partition_probe: may the caller append to a partition of a partitioned job queue? Run on
-- every partition before the queue's partition count is first recorded, so a producer or worker
-- refused its partitions records nothing. Writes nothing.
--
-- KEYS[1]  a partition's ready stream
--
-- Returns 1. Errors: RESPIRE_NOPERM naming XADD (a key outside the caller's key patterns is
-- refused by the server before the script runs: NOPERM).
--!include lib/preflight.lua

local err = respire_preflight({}, {{'XADD', KEYS[1], '*', 'f', 'v'}})
if err then return err end
return 1
