-- Delivery fencing: a delivery is current only while its entry is pending for the same consumer
-- with the same delivery count. A slow handler whose entry was recovered by another consumer (or
-- re-delivered to this one) fails the fence and can no longer complete or report.
local function respire_fence(ready, group, entry, consumer, attempt)
  local rows = redis.call('XPENDING', ready, group, entry, entry, 1)
  local row = rows[1]
  if not row then return false end
  return row[2] == consumer and tonumber(row[4]) == tonumber(attempt)
end

-- Reads the fields of one entry as a flat array, or nil when the body was deleted.
local function respire_entry(stream, id)
  local rows = redis.call('XRANGE', stream, id, id)
  if rows[1] then return rows[1][2] end
  return nil
end

local function respire_field(fields, name)
  if not fields then return nil end
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end
