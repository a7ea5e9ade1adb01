-- Retention of streams with consumer groups: the conservative MINID procedure, shared by
-- topic_trim and job_trim (include lib/stream_id.lua before it). Run inside one script, so no group can be created, removed or
-- repositioned between the inventory, the trim and the verification.

-- The smallest id above `id` (MINID with it removes `id` itself).
local function respire_id_next(id)
  local ms, seq = respire_id_parse(id)
  return string.format('%d-%d', ms, seq + 1)
end

-- Inventory of every consumer group of `stream` (XINFO GROUPS): for each group its name,
-- last-delivered-id, pending count, lowest pending id (XPENDING, false when none) and first
-- existing undelivered entry (XRANGE (last-delivered-id + COUNT 1, false when none).
-- Returns the groups (in XINFO order), the earliest of all those boundaries (nil when none)
-- and the protected ids that exist now (to verify after a trim; a pending id whose body was
-- already deleted is not protected, it is gone either way).
local function respire_trim_inventory(stream)
  local groups, boundary, protected = {}, nil, {}
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local row = {name = nil, last = '0-0', pending = 0, lowest = false, nxt = false}
    for i = 1, #g, 2 do
      if g[i] == 'name' then row.name = g[i + 1]
      elseif g[i] == 'last-delivered-id' then row.last = g[i + 1]
      elseif g[i] == 'pending' then row.pending = tonumber(g[i + 1]) end
    end
    if row.pending > 0 then
      local lowest = redis.call('XPENDING', stream, row.name, '-', '+', 1)
      if #lowest > 0 then
        row.lowest = lowest[1][1]
        if #redis.call('XRANGE', stream, row.lowest, row.lowest) > 0 then
          protected[#protected + 1] = row.lowest
        end
      end
    end
    local nxt = redis.call('XRANGE', stream, '(' .. row.last, '+', 'COUNT', 1)
    if #nxt > 0 then
      row.nxt = nxt[1][1]
      protected[#protected + 1] = row.nxt
    end
    for _, id in ipairs({row.lowest, row.nxt}) do
      if id and (boundary == nil or respire_id_lt(id, boundary)) then boundary = id end
    end
    groups[#groups + 1] = row
  end
  return groups, boundary, protected
end

-- Checks that every protected id still has its entry after a trim; nil or the error reply.
local function respire_trim_verify(stream, protected)
  for _, id in ipairs(protected) do
    if #redis.call('XRANGE', stream, id, id) == 0 then
      return redis.error_reply('RESPIRE_TRIM_VERIFY protected entry ' .. id .. ' is missing')
    end
  end
  return nil
end
