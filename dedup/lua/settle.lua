-- settle.lua: mark a batch of claimed ids DONE or FAILED, each only with its current token.
--
-- KEYS[1..n]  record keys `{ns}:r:<id>` (record layout: see claim.lua)
-- ARGV[1]     how long DONE and FAILED records are kept, ms
-- ARGV[2]     the n tokens (hex) the caller's claims got, space-separated, in KEYS order
-- ARGV[3]     n characters, one per item: 'D' for DONE, 'F' for FAILED
-- ARGV[4..]   the error text of each FAILED item, in order
--
-- An item settles only if its record is IN_FLIGHT with exactly that token (a lease that ran out
-- still settles if nobody claimed the id since: the work is done and no newer token exists).
-- DONE and FAILED keep the attempt count. A refused item changes nothing. Reads run under pcall
-- and SET replaces a string whatever it holds, so no command fails after the first write: an
-- item whose key holds another type is REJECTED, untouched, and the others settle.
-- Returns {digits, reasons}: one digit per item, 0 settled, 1 STALE (another token holds the
-- record, or it is already settled), 2 LOST (no record: it expired or Redis lost it),
-- 3 REJECTED; reasons, an array of one error text per REJECTED item, in order.

local ttl = ARGV[1]
local outcomes = ARGV[3]
local errors = 3 -- ARGV index of the last error text used
local out = {}
local reasons = {}
local i = 0
for token in string.gmatch(ARGV[2], '%x+') do
  i = i + 1
  local done = string.byte(outcomes, i) == 68 -- 'D'
  if not done then
    errors = errors + 1
  end
  local record = redis.pcall('GET', KEYS[i])
  if type(record) == 'table' then
    out[i] = '3'
    reasons[#reasons + 1] = KEYS[i] .. ': ' .. record.err
  elseif not record then
    out[i] = '2'
  else
    local prefix = 'I:' .. token .. ':'
    local attempts = string.sub(record, 1, #prefix) == prefix
      and string.match(record, '^(%d+):', #prefix + 1)
    if not attempts then
      out[i] = '1'
    else
      local settled
      if done then
        settled = 'D:' .. token .. ':' .. attempts
      else
        settled = 'F:' .. token .. ':' .. attempts .. ':' .. ARGV[errors]
      end
      redis.call('SET', KEYS[i], settled, 'PX', ttl)
      out[i] = '0'
    end
  end
end
return {table.concat(out), reasons}
