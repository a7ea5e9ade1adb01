-- Stream entry ids ('<ms>-<seq>') as numbers, and their order. Shared by lib/retention.lua,
-- lib/rq_common.lua, lib/group_lease.lua and the scripts that include them (include this file
-- first).

-- A stream id 'ms-seq' as two numbers (nil if malformed).
local function respire_id_parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then return nil end
  return tonumber(ms), tonumber(seq)
end

-- True when stream id a sorts before stream id b.
local function respire_id_lt(a, b)
  local ams, aseq = respire_id_parse(a)
  local bms, bseq = respire_id_parse(b)
  if ams ~= bms then return ams < bms end
  return aseq < bseq
end

-- A stream id as fixed-width text: ms and seq each zero-padded to 20 digits (a 64-bit unsigned
-- integer has at most 20), so text order is stream id order ('5-10' after '5-9'). Padded by
-- string operations: seq may exceed 2^53, where Lua numbers (doubles) lose digits.
local function respire_id_sortable(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return string.rep('0', 20 - #ms) .. ms .. '-' .. string.rep('0', 20 - #seq) .. seq
end

-- The stream id of respire_id_sortable's text (leading zeros stripped; an unpadded id, as
-- written before the padding existed, is returned unchanged).
local function respire_id_unsortable(text)
  local ms, seq = string.match(text, '^0*(%d+)-0*(%d+)$')
  return ms .. '-' .. seq
end
