-- claim.lua: claim a batch of message ids for one owner, in one call.
--
-- KEYS[1]     the namespace's fence hash `{ns}:fence`, fields `epoch` (the epoch the counter
--             belongs to) and `seq` (the counter, last value handed out)
-- KEYS[2..]   one record key `{ns}:r:<id>` per id, in the caller's order
-- ARGV[1]     the caller's epoch (decimal); claims proceed only if it equals the fence's epoch
-- ARGV[2]     owner (any string)
-- ARGV[3]     lease length, ms
--
-- Records (one string per id; the owner and the error text come last, so they may hold ':'):
--   IN_FLIGHT  I:<token hex>:<attempts>:<lease deadline, ms of Redis time>:<owner>
--   DONE       D:<token hex>:<attempts>                  (key expires after done_ttl)
--   FAILED     F:<token hex>:<attempts>:<error>          (key expires after done_ttl)
-- A token is epoch * 2^40 + counter; its hex form is `%x` of the epoch followed by exactly
-- ten hex digits of the counter, so Lua never does arithmetic beyond 2^53.
--
-- Returns {status, base, codes}:
--   status 0  claimed as below; the k-th CLAIMED id (1-based, in KEYS order) got counter base + k
--   status 1  the fence is missing: Redis lost data (or the namespace is new); nothing changed
--   status 2  the fence holds another epoch, returned as `base`; nothing changed
--   status 3  the counter would pass 2^40: a new epoch is needed; nothing changed
--   codes     one comma-separated code per id: n > 0 CLAIMED at attempt n, 0 DUPLICATE (DONE),
--             -m DEFERRED (a live lease held by another owner ends in m ms)
-- A caller re-claiming its own live lease gets CLAIMED with a fresh token at the same attempt
-- (a lease renewal: the old token goes stale); the same id twice in one call is DEFERRED the
-- second time, so one call never fences its own claim.
-- Needs Redis >= 7.0 (SET with both NX and GET).

local fence = redis.call('HMGET', KEYS[1], 'epoch', 'seq')
if not fence[1] or not fence[2] then
  return {1, 0, ''}
end
if fence[1] ~= ARGV[1] then
  return {2, tonumber(fence[1]), ''}
end
local base = tonumber(fence[2])
local n = #KEYS - 1
if base + n >= 1099511627776 then -- 2^40: the counter part of a token is 40 bits
  return {3, 0, ''}
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local owner = ARGV[2]
local lease = tonumber(ARGV[3])
local tail = ':' .. string.format('%d', now + lease) .. ':' .. owner
local epoch_hex = string.format('%x', tonumber(ARGV[1]))
local head = 'I:' .. epoch_hex -- a claim's record: head, counter (%010x), ':', attempts, tail
local fresh_tail = ':1' .. tail -- a new id's: attempt 1
local codes = {}
local k = 0
-- an absent id (the common case) takes one command, SET NX GET: it writes the claim and answers
-- false, or answers the present record and writes nothing; a present one takes a GET, cheaper.
-- Each id is tried the way that fits the previous one (batches are mostly new, or mostly replays)
local expect_absent = true

for i = 2, #KEYS do
  local key = KEYS[i]
  local record = nil -- false once known absent (and claimed at attempt 1), else the record
  if expect_absent then
    local fresh = head .. string.format('%010x', base + k + 1) .. fresh_tail
    record = redis.pcall('SET', key, fresh, 'NX', 'GET')
    if type(record) == 'table' then
      -- an error: at maxmemory Redis refuses a script's first write, so read instead (a DONE
      -- id still answers DUPLICATE); a write below then fails as it would have anyway, and
      -- other errors (WRONGTYPE) come back from GET
      record = nil
    end
  end
  if record == nil then
    record = redis.call('GET', key)
    if not record then
      redis.call('SET', key, head .. string.format('%010x', base + k + 1) .. fresh_tail)
    end
  end
  expect_absent = not record
  local code = '1'
  if record then
    local attempts = nil -- set when the id is CLAIMED over its record
    local state = string.byte(record, 1)
    if state == 68 then -- 'D'
      code = '0'
    elseif state == 70 then -- 'F'
      attempts = tonumber(string.match(record, '^F:%x+:(%d+)')) + 1
    else -- 'I'
      local token, held, deadline, holder = string.match(record, '^I:(%x+):(%d+):(%d+):(.*)$')
      local left = tonumber(deadline) - now
      if left <= 0 then
        attempts = tonumber(held) + 1
      elseif holder ~= owner then
        code = '-' .. left
      elseif string.sub(token, 1, -11) == epoch_hex
          and tonumber(string.sub(token, -10), 16) > base then
        code = '-' .. left -- claimed earlier in this very call
      else
        attempts = held
      end
    end
    if attempts then
      code = tostring(attempts)
      redis.call('SET', key, head .. string.format('%010x', base + k + 1) .. ':' .. code .. tail)
    end
  end
  if code ~= '0' and string.byte(code, 1) ~= 45 then -- neither DUPLICATE nor DEFERRED ('-')
    k = k + 1
  end
  codes[i - 1] = code
end

if k > 0 then
  redis.call('HINCRBY', KEYS[1], 'seq', k)
end
return {0, base, table.concat(codes, ',')}
