-- lease.lua: lease a batch of message ids of one shard for one owner, in one call.
--
-- KEYS[1]     the shard's fence hash `{tag}:fence`, fields `epoch` (the epoch the counter
--             belongs to) and `seq` (the counter, last value handed out)
-- KEYS[2..]   one record key `{tag}:r:<id>` per id, in the caller's order (one hash tag: one
--             Redis Cluster slot)
-- ARGV[1]     the caller's epoch (decimal); leases proceed only if it equals the fence's epoch
-- ARGV[2]     owner (any string)
-- ARGV[3]     lease length, ms
-- ARGV[4]     how long an IN_FLIGHT record is kept, ms (>= the lease; see dedup/store.py)
--
-- Records (one string per id; the owner and the error text come last, so they may hold ':'):
--   IN_FLIGHT  I:<token hex>:<attempts>:<lease deadline, ms of Redis time>:<owner>
--              (key expires ARGV[4] ms after the lease)
--   DONE       D:<token hex>:<attempts>                  (key expires after done_ttl)
--   FAILED     F:<token hex>:<attempts>:<error>          (key expires after done_ttl)
-- A token is epoch * 2^40 + counter; its hex form is `%x` of the epoch followed by exactly
-- ten hex digits of the counter, so Lua never does arithmetic beyond 2^53.
--
-- All or nothing: the counter is advanced by one per id before any record is written, so an id
-- at position k (1-based, in KEYS order) has counter base + k whether it is leased or not, and
-- no token is ever handed out twice. Every per-id command runs under pcall; an id whose key
-- holds another type, or a string that is not a record, is REJECTED and left untouched, while
-- the other ids are leased. At maxmemory Redis refuses the reservation (the first write): the
-- call then answers from reads alone if every id is DONE, and fails with Redis's error if not,
-- having written nothing.
--
-- Returns {status, base, runs, reasons}; the statuses are dedup.scripts.LeaseScriptStatus:
--   status 0  LEASED: the ids were answered as below
--   status 1  FENCE_MISSING: Redis lost data (or the shard is new); nothing changed
--   status 2  EPOCH_MISMATCH: the fence holds another epoch, returned as `base`; nothing changed
--   status 3  COUNTER_USED_UP: the counter would pass 2^40: a new epoch is needed; nothing
--             changed
--   runs      the answers as counted runs of consecutive ids, `<code>:<count>` joined by ',':
--             code n > 0 LEASED at attempt n, 0 DUPLICATE (DONE), -m DEFERRED (a live lease
--             held by another owner; m: the longest wait in the run, ms), r REJECTED
--             (dedup.scripts.REJECTED_RUN); a batch of new ids answers `1:<n>`
--   reasons   an array of one error text per REJECTED id, in order
--   a fifth element, 1, if nothing was written (the reservation was refused): a WAIT after this
--   call then proves nothing about the DONE records it read
-- A caller re-leasing its own live lease gets LEASED with a fresh token at the same attempt
-- (a lease renewal: the old token goes stale); the same id twice in one call is DEFERRED the
-- second time, so one call never fences its own lease.
-- Needs Redis >= 7.0 (SET with both NX and GET).

local fence = redis.call('HMGET', KEYS[1], 'epoch', 'seq')
if not fence[1] or not fence[2] then
  return {1, 0, '', {}}
end
if fence[1] ~= ARGV[1] then
  return {2, tonumber(fence[1]), '', {}}
end
local base = tonumber(fence[2])
local n = #KEYS - 1
if base + n >= 1099511627776 then -- 2^40: the counter part of a token is 40 bits
  return {3, 0, '', {}}
end

-- the record's fields if `record` is one, else nil
local function parse(record)
  local state = string.byte(record, 1)
  if state == 68 then -- 'D'
    if string.find(record, '^D:%x+:%d+$') then -- find: no match string is made
      return 'D'
    end
  elseif state == 70 then -- 'F'
    local attempts = string.match(record, '^F:%x+:(%d+):')
    if attempts then
      return 'F', attempts
    end
  elseif state == 73 then -- 'I'
    local token, attempts, deadline, holder = string.match(record, '^I:(%x+):(%d+):(%d+):(.*)$')
    if token then
      return 'I', attempts, token, tonumber(deadline), holder
    end
  end
  return nil
end

local NOT_A_RECORD = 'the key holds a string that is not an idempotency record'
local DEFER = 'd' -- a DEFERRED id's code while its run is counted (the run then answers -wait)

local reserved = redis.pcall('HINCRBY', KEYS[1], 'seq', n)
if type(reserved) == 'table' then
  -- refused (at maxmemory Redis refuses a script's first write): answer DONE ids from reads
  for i = 2, #KEYS do
    local record = redis.pcall('GET', KEYS[i])
    if type(record) ~= 'string' or parse(record) ~= 'D' then
      return reserved
    end
  end
  return {0, base, '0:' .. n, {}, 1}
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local owner = ARGV[2]
local lease = tonumber(ARGV[3])
local keep = ARGV[4]
local tail = ':' .. string.format('%d', now + lease) .. ':' .. owner
local epoch_hex = string.format('%x', tonumber(ARGV[1]))
local head = 'I:' .. epoch_hex -- a lease's record: head, counter (%010x), ':', attempts, tail
local fresh_tail = ':1' .. tail -- a new id's: attempt 1
local runs = {}
local run_code, run_count, run_wait = nil, 0, 0
local reasons = {}
-- an absent id (the common case) takes one command, SET NX GET: it writes the lease and answers
-- false, or answers the present record and writes nothing. Present ids (replays) are read in
-- bulk instead: MGET of the next PREFETCH keys, one command for many ids, and a present one that
-- is not leased again costs nothing more. Each id is tried the way that fits the previous one
-- (batches are mostly new, or mostly replays). A prefetched value is stale only if this call
-- wrote the key after the MGET (the same id twice in one call): such keys are in `written` and
-- read again; a prefetched absence goes through SET NX GET, which sees any write of this call.
local PREFETCH = 1000 -- keys per MGET (Lua's unpack fails at about 8000)
local expect_absent = true
local fetched, fetched_from, fetched_to = nil, 0, 0 -- KEYS[fetched_from .. fetched_to]
local written = {} -- keys written (over a present record) after their MGET

for i = 2, #KEYS do
  local key = KEYS[i]
  local record = false
  if not expect_absent then
    if i > fetched_to then
      fetched_from, fetched_to = i, math.min(i + PREFETCH - 1, #KEYS)
      fetched = redis.call('MGET', unpack(KEYS, fetched_from, fetched_to))
    end
    if written[key] then
      record = redis.pcall('GET', key)
    else
      record = fetched[i - fetched_from + 1]
    end
  end
  if record == false then
    local counter = string.format('%010x', base + i - 1)
    record = redis.pcall('SET', key, head .. counter .. fresh_tail, 'PX', keep, 'NX', 'GET')
  end
  expect_absent = not record
  local code = '1'
  local wait = 0
  if type(record) == 'table' then -- WRONGTYPE: the key is not ours; nothing was written
    code = 'r'
    reasons[#reasons + 1] = key .. ': ' .. record.err
  elseif record then
    local state, held, token, deadline, holder = parse(record)
    local attempts = nil -- set when the id is LEASED over its record
    if state == 'D' then
      code = '0'
    elseif state == 'F' then
      attempts = tonumber(held) + 1
    elseif state == 'I' then
      wait = deadline - now
      if wait <= 0 then
        attempts = tonumber(held) + 1
      elseif holder ~= owner then
        code = DEFER
      elseif string.sub(token, 1, -11) == epoch_hex
          and tonumber(string.sub(token, -10), 16) > base then
        code = DEFER -- leased earlier in this very call
      else
        attempts = held
      end
    else
      code = 'r'
      reasons[#reasons + 1] = key .. ': ' .. NOT_A_RECORD
    end
    if attempts then
      code = tostring(attempts)
      local counter = string.format('%010x', base + i - 1)
      redis.call('SET', key, head .. counter .. ':' .. code .. tail, 'PX', keep)
      written[key] = true
    end
  end
  if code == run_code then
    run_count = run_count + 1
  else
    if run_count > 0 then
      runs[#runs + 1] = (run_code == DEFER and '-' .. run_wait or run_code) .. ':' .. run_count
    end
    run_code, run_count, run_wait = code, 1, 0
  end
  if code == DEFER and wait > run_wait then
    run_wait = wait
  end
end
runs[#runs + 1] = (run_code == DEFER and '-' .. run_wait or run_code) .. ':' .. run_count

return {0, base, table.concat(runs, ','), reasons}
