-- lease.lua: lease a batch of message ids of one shard for one owner, in one call.
--
-- KEYS[1]     the shard's fence hash `{tag}:fence`, fields `epoch` (the epoch the counter
--             belongs to), `seq` (the counter, last value handed out), `bucket` (the width of
--             the shard's record buckets, ms) and `keep` (how long a bucket is kept past its
--             end, ms: the longest `ARGV[4]` any caller asked for)
-- ARGV[1]     the caller's epoch (decimal); leases proceed only if it equals the fence's epoch
-- ARGV[2]     owner (any string)
-- ARGV[3]     lease length, ms
-- ARGV[4]     how long a record is kept at least, ms (the lease plus the dedup window)
-- ARGV[5..]   the ids, in the caller's order
--
-- Records are fields of the shard's buckets (buckets.lua): a lookup reads the buckets that may
-- still hold a record, newest first, one HMGET per bucket for the whole batch, and one HSET writes
-- the batch's records to the bucket of now.
-- Record values (the owner and the error text come last, so they may hold ':'):
--   IN_FLIGHT  I:<token hex>:<attempts>:<lease deadline, ms of Redis time>:<ids>:<owner>, where
--              <ids> is how many ids the lease call leased (settle.lua marks them DONE together
--              when one call settles them all; the record then reads as DONE: buckets.lua)
--   DONE       D:<token hex>:<attempts>
--   FAILED     F:<token hex>:<attempts>:<error>
-- A token is epoch * 2^40 + counter; its hex form is `%x` of the epoch followed by exactly
-- ten hex digits of the counter, so Lua never does arithmetic beyond 2^53. A call advances the
-- counter by one, before any record is written, and every id it leases gets that token: per id,
-- tokens strictly increase from lease to lease, which is what fencing compares, and the records
-- of a batch share one value.
--
-- A field that holds no record is REJECTED and left untouched, while the other ids are leased.
-- At maxmemory Redis refuses the reservation (the first write): the call then answers from reads
-- alone if every id is DONE, and fails with Redis's error if not, having written nothing.
--
-- Returns {status, base, runs, reasons}; the statuses are dedup.scripts.LeaseScriptStatus:
--   status 0  LEASED: the ids were answered as below
--   status 1  FENCE_MISSING: Redis lost data (or the shard is new); nothing changed
--   status 2  EPOCH_MISMATCH: the fence holds another epoch, returned as `base`; nothing changed
--   status 3  COUNTER_USED_UP: the counter would pass 2^40: a new epoch is needed; nothing
--             changed
--   base      the counter before the call: the leased ids' token is epoch * 2^40 + base + 1
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

local FIRST = 5 -- ARGV index of the first id
local fence = redis.call('HMGET', KEYS[1], 'epoch', 'seq', 'bucket', 'keep')
if not fence[1] or not fence[2] or not fence[3] then
  return {1, 0, '', {}}
end
if fence[1] ~= ARGV[1] then
  return {2, tonumber(fence[1]), '', {}}
end
local base = tonumber(fence[2])
local n = #ARGV - FIRST + 1
if base + 1 >= 1099511627776 then -- 2^40: the counter part of a token is 40 bits
  return {3, 0, '', {}}
end

-- the record's fields if `record` is one, else nil; an IN_FLIGHT one's token last
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
    local token, attempts, deadline, holder = string.match(record, '^I:(%x+):(%d+):(%d+):%d+:(.*)$')
    if token then
      if marked(token) then
        return 'D'
      end
      return 'I', attempts, tonumber(deadline), holder, token
    end
  end
  return nil
end

local width, keep, prefix, ids, now, current = placed(fence[3], fence[4], ARGV[4], FIRST, n)

local reserved = redis.pcall('HINCRBY', KEYS[1], 'seq', 1)
if type(reserved) == 'table' then
  -- refused (at maxmemory Redis refuses a script's first write): answer DONE ids from reads
  local found = look_up(prefix, ids, current, width, keep)
  for i = 1, n do
    if not found[i] or parse(found[i]) ~= 'D' then
      return reserved
    end
  end
  return {0, base, '0:' .. n, {}, 1}
end
if keep > tonumber(fence[4] or 0) then
  redis.call('HSET', KEYS[1], 'keep', keep)
end

local found, where = look_up(prefix, ids, current, width, keep)
local lease = tonumber(ARGV[3])
local owner = ARGV[2]
local runs = {}
local run_code, run_count, run_wait = nil, 0, 0
local reasons = {}
local writes = {} -- field, value, ... for the current bucket
local moved = {} -- per older bucket, the fields written anew in the current one
local leased = {} -- ids leased by this call: the same id again is DEFERRED
local overwritten = {} -- the tokens of IN_FLIGHT records leased again: their proofs go
local DEFER = 'd' -- a DEFERRED id's code while its run is counted (the run then answers -wait)
local parsed, state, held, deadline, holder, token -- the last record parsed, and its fields

for i = 1, n do
  local id = ids[i]
  local record = found[i]
  local code = '1'
  local wait = 0
  local attempts = nil -- set when the id is LEASED
  if leased[id] then
    code, wait = DEFER, lease
  elseif not record then
    attempts = 1
  else
    if record ~= parsed then -- a batch's records share one value: parsed once
      parsed = record
      state, held, deadline, holder, token = parse(record)
    end
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
      else
        attempts = held
      end
    else
      code = 'r'
      reasons[#reasons + 1] = prefix .. where[i] .. ' ' .. id .. ': the field holds a value '
        .. 'that is not an idempotency record'
    end
  end
  if attempts then
    code = attempts == 1 and '1' or tostring(attempts)
    if state == 'I' and record then
      overwritten[token] = true
    end
    writes[#writes + 1] = id
    writes[#writes + 1] = code -- the record, once the number of ids leased is known
    leased[id] = true
    moving(moved, where[i], current, id)
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

if #writes > 0 then
  -- every record of this call: I:<token>:<attempts>:<deadline>:<ids leased>:<owner>
  local mine = string.format('%x%010x', tonumber(ARGV[1]), base + 1) -- this call's token
  local until_text = string.format('%d', now + lease) -- the lease's deadline
  local head = 'I:' .. mine .. ':'
  local tail = ':' .. until_text .. ':' .. #writes / 2 .. ':' .. owner
  local fresh = head .. '1' .. tail -- a new id's, at attempt 1
  for j = 2, #writes, 2 do
    local code = writes[j]
    writes[j] = code == '1' and fresh or head .. code .. tail
  end
  in_chunks('HSET', prefix .. current, writes)
  kept(prefix, current, width, keep, moved)
  forget_leases(overwritten)
  if run_count == n then
    -- one run, and ids were leased: every id, at one attempt; its proof (buckets.lua)
    local sum = digest(FIRST, n, true)
    if sum then
      redis.call('SET', LEASES .. mine, n .. ':' .. run_code .. ':' .. current .. ':' .. sum,
        'PXAT', until_text)
    end
  end
end

return {0, base, table.concat(runs, ','), reasons}
