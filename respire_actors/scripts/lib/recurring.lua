-- Shared helpers of the recurring scripts. A definition (a field of the :recurring hash, named
-- by the schedule id) is one header line, a newline, then the encoded payload:
--
--   <format> <revision> <last tick ms or -> <rest of the header (policy, anchor, spec)>\n<payload>
--
-- Only the Python side reads the rest of the header; scripts read the revision and rewrite the
-- last tick.

-- Returns format, revision, last tick, rest, payload-with-its-leading-newline; nil if malformed.
local function respire_recurring_parse(blob)
  local nl = string.find(blob, '\n', 1, true)
  if not nl then return nil end
  local head = string.sub(blob, 1, nl - 1)
  local format, revision, last, rest = string.match(head, '^(%S+) (%S+) (%S+) (.*)$')
  if not format then return nil end
  return format, revision, last, rest, string.sub(blob, nl)
end
