-- Appends one dead letter to `dead`: the entry's fields (`fields`, or `fallback` when the body
-- is gone), then _respire.total_attempts when the job was durably retried (its fields carry
-- _respire.job.attempts), then _respire.source_id, _respire.attempt, _respire.reason and
-- _respire.consumer, then the optional `tail` pairs (e.g. _respire.detail). Returns the new
-- dead-letter id (for compensation).
local function respire_dead_letter(dead, fields, fallback, source_id, attempt, reason, consumer,
                                   tail)
  local copy = {}
  local src = fields or fallback or {}
  for i = 1, #src do copy[i] = src[i] end
  local prior = nil
  if fields then
    for i = 1, #fields, 2 do
      if fields[i] == '_respire.job.attempts' then prior = fields[i + 1] end
    end
  end
  if prior then
    copy[#copy + 1] = '_respire.total_attempts'
    copy[#copy + 1] = tostring((tonumber(prior) or 0) + tonumber(attempt))
  end
  for _, v in ipairs({'_respire.source_id', source_id, '_respire.attempt', tostring(attempt),
                      '_respire.reason', reason, '_respire.consumer', consumer}) do
    copy[#copy + 1] = v
  end
  for _, v in ipairs(tail or {}) do copy[#copy + 1] = v end
  return redis.call('XADD', dead, '*', unpack(copy))
end
