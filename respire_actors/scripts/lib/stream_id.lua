-- Stream entry ids ('<ms>-<seq>') as numbers, and their order. Shared by lib/retention.lua,
-- lib/rq_common.lua and the scripts that include them (include this file first).

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
