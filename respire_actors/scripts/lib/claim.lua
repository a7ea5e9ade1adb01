-- One page of pending-entry claiming, shared by recovery and startup replay.
-- mode 'recover': XAUTOCLAIM entries idle for at least min_idle ms, from cursor.
-- mode 'replay':  re-claim this consumer's own pending entries after cursor (XPENDING + XCLAIM).
-- Returns entries ({id, fields} as XCLAIM gives them), the next cursor ('0-0' = pass complete)
-- and how many PEL references to deleted bodies were cleared.
local function respire_claim_page(stream, group, consumer, mode, min_idle, cursor, count)
  local entries, next_cursor, deleted = {}, '0-0', 0
  if mode == 'recover' then
    local r = redis.call('XAUTOCLAIM', stream, group, consumer, min_idle, cursor, 'COUNT', count)
    next_cursor = r[1]
    entries = r[2]
    if r[3] then deleted = #r[3] end
  else
    local start = '-'
    if cursor ~= '0-0' then start = '(' .. cursor end
    local rows = redis.call('XPENDING', stream, group, start, '+', count, consumer)
    if #rows > 0 then
      local ids = {}
      for i, row in ipairs(rows) do ids[i] = row[1] end
      entries = redis.call('XCLAIM', stream, group, consumer, 0, unpack(ids))
      if #entries < #ids then deleted = #ids - #entries end
      if #rows == count then next_cursor = rows[#rows][1] end
    end
  end
  return entries, next_cursor, deleted
end

-- The pending entries a page from `cursor` would claim, read without claiming (XPENDING rows:
-- id, consumer, idle ms, delivery count): recovery's entries idle at least min_idle from the
-- cursor on, replay's entries of this consumer after the cursor; at most `count`.
local function respire_claim_candidates(stream, group, consumer, mode, min_idle, cursor, count)
  if mode == 'recover' then
    local start = cursor
    if start == '0-0' then start = '-' end
    return redis.call('XPENDING', stream, group, 'IDLE', min_idle, start, '+', count)
  end
  local start = '-'
  if cursor ~= '0-0' then start = '(' .. cursor end
  return redis.call('XPENDING', stream, group, start, '+', count, consumer)
end

-- Whether a page from `cursor` would find anything to claim (no write): replay looks for this
-- consumer's pending entries after the cursor, recovery for any entry idle at least min_idle
-- from the cursor on. Lets a rate-limited page that would claim nothing end its pass instead
-- of waiting for a permit it does not need.
local function respire_claim_peek(stream, group, consumer, mode, min_idle, cursor)
  return #respire_claim_candidates(stream, group, consumer, mode, min_idle, cursor, 1) > 0
end
