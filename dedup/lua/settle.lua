-- settle.lua: mark a batch of leased ids of one shard DONE or FAILED, each only with its
-- current token, and apply each DONE item's side effects with it.
--
-- KEYS[1]      the shard's fence hash `{tag}:fence` (the record buckets' width: see buckets.lua)
-- KEYS[2..]    the sums' keys (see below), the field groups' keys, the merged writes' keys (an
--              MSET's: one per item), then the other effects' keys (the caller's own keys), in
--              order; on a Redis Cluster they carry the shard's hash tag, so the call touches one
--              slot
-- ARGV[1]      how long a record is kept at least, ms (the lease plus the dedup window)
-- ARGV[2]      the items' leases as the caller's lease answered them, in runs of items with
--              one lease: `<token hex>:<attempts>/<items>`, space-separated (attempts 0: unknown)
-- ARGV[3]      n characters, one per item: 'D' for DONE, 'F' for FAILED
-- ARGV[4]      the effects' shapes, '' if every effect is combined (below) or none is given: per
--              item, one letter and an argument count per effect, then ','; e.g. 'H2,,A2S1,'
--              is HINCRBY (field, n) for item 1, nothing for item 2, SADD with two members and
--              SET for item 3. Letters: S SET, I INCRBY, H HINCRBY, A SADD, T HSET; any other
--              character is an error reply before anything is written. An item whose effect is
--              in a sum, a field group or a merged write (see below) has none here
-- ARGV[5]      how many sums
-- ARGV[6]      how many field groups (below)
-- ARGV[7]      how many merged writes (below)
-- ARGV[8..7+n] the items' ids
-- then         per sum: 'I' or 'H', the field ('' for INCRBY), the total, the increments and
--              its items' positions (from 1), both space-separated in item order; per field
--              group: how many fields, the fields, the increments and the positions as for a
--              sum; per merged write: 'S', 'A' or 'T', how many arguments, the items' arguments
--              (after the key), how many each item has and the positions, both space-separated;
--              then per item in order: the error text of a FAILED item, the effects' arguments
--              (after the key) of a DONE item whose effect is combined in none of these
--
-- An item settles only if its record is IN_FLIGHT with exactly that token (a lease that ran out
-- still settles if nobody leased the id since: the work is done and no newer token exists); an
-- item whose record holds the token at another attempt count settles at the record's count.
-- DONE and FAILED keep the attempt count. When the call settles every id of one lease call
-- (the record says how many it leased) before that lease's deadline, the lease's token is marked
-- DONE (buckets.lua) and its DONE items write nothing more: a bolt's part costs one SET. A call
-- that is exactly one lease call's ids, in its order, all DONE, is proven whole by that lease's
-- proof (buckets.lua) and marked without reading its records (the proof answers for these
-- scripts' writes: a record overwritten by anything else is seen only where records are read).
-- Settling any record of a lease call deletes its proof. The other settled records are written
-- with one HSET to the bucket of now (records moved from an older bucket are deleted there), so
-- each is kept ARGV[1] ms at least from its settlement.
-- Nothing is written for an item that does not settle: STALE (another lease's record, one
-- already settled, a value that is no record, or the same id earlier in this call) or LOST (no
-- record).
--
-- All or nothing: the records and marks are the call's first writes, so a server that refuses
-- writes (out of memory, a replica, a disk error, too few replicas; Redis refuses only a
-- script's first write) fails the whole call with Redis's error, having written nothing, no
-- message blamed.
-- An item with an effect Redis would refuse applies none of them and becomes FAILED with the
-- reason (REJECTED). An item's only effect (the common case) runs under pcall: Redis checks a
-- command before it writes anything, so it applies whole or not at all. An item with several
-- has each checked, before any is written, against the data as its earlier effects leave it:
-- the key's type, a value Redis parses as an integer, a sum that stays within 64 bits. Reads
-- run under pcall and the checks are exact, so no command fails halfway: a batch never stops
-- half applied, and the items after a rejected one settle. Effects run in item order, after
-- the records are written; a REJECTED item's record is then rewritten FAILED.
--
-- A sum (dedup.effects.CallEffects.sums: the increments of one key and field by two or more items,
-- each its item's only effect, all of one sign, and no other effect of the call on that key) is
-- applied after every item's effects: one INCRBY or HINCRBY of the total when all its items
-- settled and Redis takes it, else its settled items' increments one by one in item order (so
-- where the total would overflow, the items Redis refuses one by one are the ones REJECTED).
-- Nothing else in the call touches its key, so applying it last, or at once, leaves what
-- applying each increment with its item would; a batch of counts sends each key and field once,
-- not once per item.
--
-- A field group (dedup.effects.CallEffects.groups: HINCRBYs of distinct fields of one hash, one
-- item each, each its item's only effect, and nothing but HINCRBYs on that key) is applied with
-- one HMGET of its settled items' fields and one HSET of the values HINCRBY would leave, computed
-- exactly (a counter per id costs its field, not a command); where HINCRBY would refuse one (a
-- value that is no integer, an overflow, a key of another type), its items' HINCRBYs run one by
-- one in item order instead, and the items Redis refuses are REJECTED.
--
-- A merged write (dedup.effects.CallEffects.merged: lone SETs, each its item's only effect, with
-- nothing else in the call on their keys; or lone SADDs or HSETs of one key, likewise) is one
-- MSET of the settled items' keys and values ('S', a key per item in KEYS), or one SADD or HSET
-- of its key ('A', 'T'): what each item's own command would leave, the last value winning where
-- two items set one key or field. Where Redis refuses it (a key of another type), nothing was
-- written, and its items' commands run one by one in item order instead, so the items Redis
-- refuses are REJECTED.
--
-- Returns {digits, reasons}: digits '' if every item settled, else one digit per item
-- (dedup.scripts.SettleCode), 0 SETTLED, 1 STALE, 2 LOST, 3 REJECTED; reasons, an array of one
-- error text per REJECTED item, in order. A shard without a fence (Redis lost its data) answers
-- LOST for every item.

local COMMANDS = {S = 'SET', I = 'INCRBY', H = 'HINCRBY', A = 'SADD', T = 'HSET'}
local KINDS = {SET = 'string', INCRBY = 'string', HINCRBY = 'hash', SADD = 'set', HSET = 'hash'}
-- an O(1) read per command that fails with WRONGTYPE if the key holds another type (SET
-- replaces any value, so it needs none); INCRBY's and HINCRBY's also read the value
local PROBES = {INCRBY = 'GET', HINCRBY = 'HGET', SADD = 'SCARD', HSET = 'HLEN'}
local WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local MAX_ARGS = 1000 -- per effect; dedup.effects.MAX_EFFECT_ARGS (unpack fails at about 8000)

local shapes = ARGV[4]
local bad = string.match(shapes, '[^,%dSIHAT]')
if bad then
  return redis.error_reply('effect command code ' .. bad .. ' is not allowed')
end

-- the effect at shapes[p]: the position after it, its argument count, its command
local function effect_at(p)
  local _, last, code, count = string.find(shapes, '^(%a)(%d+)', p)
  return last + 1, tonumber(count), COMMANDS[code]
end

-- 64-bit integers as two exact doubles: value = hi * LIMB + lo, 0 <= lo < LIMB (Lua's numbers
-- are exact only up to 2^53)
local LIMB = 1e10
local MAX_HI, MAX_LO = 922337203, 6854775807 -- 2^63 - 1
local MIN_HI, MIN_LO = -922337204, 3145224192 -- -2^63

local function in_range(hi, lo)
  if (hi > MIN_HI or (hi == MIN_HI and lo >= MIN_LO))
      and (hi < MAX_HI or (hi == MAX_HI and lo <= MAX_LO)) then
    return {hi, lo}
  end
  return nil
end

-- `value` as Redis reads an integer (no '+', no leading zeros, 64 bits; absent is 0), or nil
local function int64(value)
  if value == false or value == '0' then
    return {0, 0}
  elseif type(value) == 'table' then -- a sum computed earlier in this item
    return value
  end
  local minus, digits = string.match(value, '^(%-?)([1-9]%d*)$')
  if not digits or #digits > 19 then
    return nil
  end
  local hi, lo = tonumber(string.sub(digits, 1, -11)) or 0, tonumber(string.sub(digits, -10))
  if minus == '-' then
    hi, lo = -hi, -lo
    if lo < 0 then
      hi, lo = hi - 1, lo + LIMB
    end
  end
  return in_range(hi, lo)
end

-- `value` + the increment `text`, or nil and why Redis would refuse it
local function add(command, value, text)
  local by = int64(text)
  if not by then
    return nil, 'the increment is not a 64-bit integer'
  end
  local old = int64(value)
  if not old then
    return nil, command == 'HINCRBY' and 'hash value is not an integer'
      or 'value is not an integer or out of range'
  end
  local lo = old[2] + by[2]
  local hi = old[1] + by[1]
  if lo >= LIMB then
    hi, lo = hi + 1, lo - LIMB
  end
  local sum = in_range(hi, lo)
  if not sum then
    return nil, 'increment or decrement would overflow'
  end
  return sum
end

-- nil if `command` (arguments ARGV[a .. a + count - 1]) can run on `key` as the item's earlier
-- effects leave it, which `view` (key -> what those effects put there) then records; else why
-- not. Keys the item has not touched yet are read from Redis.
local function problem(view, command, key, a, count)
  local kind = KINDS[command]
  local seen = view[key]
  if count > MAX_ARGS then
    return 'more than ' .. MAX_ARGS .. ' arguments'
  end
  if command == 'SET' then
    view[key] = {kind = kind, value = ARGV[a]}
    return nil
  end
  if seen and seen.kind ~= kind then
    return WRONGTYPE
  end
  if not seen then
    local probe
    if command == 'HINCRBY' then
      probe = redis.pcall('HGET', key, ARGV[a])
    else
      probe = redis.pcall(PROBES[command], key)
    end
    if type(probe) == 'table' then
      return probe.err
    end
    seen = {kind = kind, value = probe, fields = {}}
    if command == 'HINCRBY' then
      seen.fields[ARGV[a]] = probe
    end
    view[key] = seen
  end
  if command == 'INCRBY' then
    local sum, why = add(command, seen.value, ARGV[a])
    seen.value = sum
    return why
  elseif command == 'HINCRBY' then
    local field = ARGV[a]
    local value = seen.fields[field]
    if value == nil then
      value = redis.call('HGET', key, field) -- the key is a hash or absent: checked above
    end
    local sum, why = add(command, value, ARGV[a + 1])
    seen.fields[field] = sum
    return why
  elseif command == 'HSET' then
    for f = a, a + count - 1, 2 do
      seen.fields[ARGV[f]] = ARGV[f + 1]
    end
  end
  return nil
end

-- Why Redis refused a command, from its pcall reply (the error text without the `ERR ` code),
-- or nil if it ran.
local function refusal(reply)
  if type(reply) == 'table' and reply.err then
    return (string.gsub(reply.err, '^ERR ', ''))
  end
  return nil
end

-- An item's only effect: Redis checks a command's arguments and the key's type and value before
-- it writes anything, so running it under pcall applies it whole or not at all, with no check
-- first. Returns nil, or why Redis refused it (its error text without the `ERR ` code).
local function apply_alone(command, key, a, count)
  local reason = nil
  if count > MAX_ARGS then
    reason = 'more than ' .. MAX_ARGS .. ' arguments'
  else
    reason = refusal(redis.pcall(command, key, unpack(ARGV, a, a + count - 1)))
  end
  return reason and command .. ' on ' .. key .. ': ' .. reason
end

-- An item's effects shapes[from, to), each checked (`problem`) against the data as the earlier
-- ones leave it before any is written: a refusal halfway would leave the item half applied.
-- Returns nil once all are applied, or why one would be refused (none applied).
local function apply_checked(from, to, a, k)
  local view = {}
  local p, count, command = from, 0, nil
  local first_arg, first_key = a, k
  while p < to do
    p, count, command = effect_at(p)
    local reason = problem(view, command, KEYS[k], a, count)
    if reason then
      return command .. ' on ' .. KEYS[k] .. ': ' .. reason
    end
    a, k = a + count, k + 1
  end
  p, a, k = from, first_arg, first_key
  while p < to do
    p, count, command = effect_at(p)
    redis.call(command, KEYS[k], unpack(ARGV, a, a + count - 1))
    a, k = a + count, k + 1
  end
  return nil
end

local outcomes = ARGV[3]
local n = #outcomes
local FIRST = 8 -- ARGV index of the first id
local out = {} -- the digit of each item not settled
local why = {} -- the reason of each REJECTED item
local refused = false

local fence = redis.call('HMGET', KEYS[1], 'bucket', 'keep')
if not fence[1] then -- Redis lost data: no record can be there
  return {string.rep('2', n), {}}
end
local width, keep, prefix, ids, now, current = placed(fence[1], fence[2], ARGV[1], FIRST, n)

-- When the mark of a lease call whose records are in `bucket` expires: with that bucket, as
-- `kept` leaves it (later if `keep` grew)
local function mark_expiry(bucket)
  return string.format('%d', math.max(redis.call('PEXPIRETIME', prefix .. bucket),
    (bucket + 1) * width + keep))
end

-- The lease call this call settles whole by its proof (buckets.lua): exactly its ids, in its
-- order, all DONE, within the lease (the proof expires at its deadline). Its token, attempt and
-- records' bucket, or nil where the call is no such settlement.
local function proven_lease()
  if string.find(outcomes, '[^D]') then
    return nil
  end
  -- (the caller's attempt count may differ: an item settles at its record's, here the proof's)
  local token, items = string.match(ARGV[2], '^(%x+):%d+/(%d+)$')
  if not token or tonumber(items) ~= n or marked(token) then
    return nil
  end
  local proof = redis.call('GET', LEASES .. token)
  if not proof then
    return nil
  end
  local count, proven, bucket, sum = string.match(proof, '^(%d+):(%d+):(%d+):(%x+)$')
  if tonumber(count) ~= n or sum ~= digest(FIRST, n) then
    return nil
  end
  return token, proven, tonumber(bucket)
end

local found, where -- each item's record (false: none) and the bucket it is in
local proven_token, proven_attempts, proven_bucket = proven_lease()
if proven_token then
  -- the records as the proof stands for them: read back, they would hold this lease, live.
  -- Redis judges the proof's expiry at the script's start, so the lease was live then; `now`
  -- stands for its deadline (where TIME has passed it by a millisecond, the walk would write
  -- DONE records instead of the mark: DONE either way)
  local live = string.format('%d', now)
  local record = table.concat({'I', proven_token, proven_attempts, live, n, ''}, ':')
  found = setmetatable({}, {__index = function() return record end})
  where = setmetatable({}, {__index = function() return proven_bucket end})
else
  found, where = look_up(prefix, ids, current, width, keep)
end

local sums = {}
for c = 1, tonumber(ARGV[5]) do
  local a = FIRST + n + 5 * (c - 1)
  sums[c] = {command = COMMANDS[ARGV[a]], key = KEYS[1 + c], field = ARGV[a + 1],
    total = ARGV[a + 2], increments = ARGV[a + 3], positions = ARGV[a + 4]}
end
local at = FIRST + n + 5 * #sums -- next ARGV of the stream
local groups = {}
for g = 1, tonumber(ARGV[6]) do
  local count = tonumber(ARGV[at])
  groups[g] = {key = KEYS[1 + #sums + g], fields = at + 1, increments = ARGV[at + count + 1],
    positions = ARGV[at + count + 2]}
  at = at + count + 3
end
local key_at = 2 + #sums + #groups -- next key: the merged writes', then the other effects'
local merges = {}
for m = 1, tonumber(ARGV[7]) do
  local code, count = ARGV[at], tonumber(ARGV[at + 1])
  merges[m] = {code = code, key = key_at, args = at + 2, count = count,
    counts = ARGV[at + count + 2], positions = ARGV[at + count + 3]}
  at = at + count + 4
  key_at = key_at + (code == 'S' and count or 1) -- 'S': a key and a value per item
end
local leases = {} -- each settled item's lease (`<token hex>:<attempts>` of its record)
local errors = {} -- each settled FAILED item's error text (its ARGV)
local effects = {} -- per settled DONE item with effects: {from, to, first argument, first key}
local batch_of = {} -- per settled item, its lease call: {token, ids, deadline, bucket, here}
local batches = {} -- token -> its lease call, as above; `here` counts its items in this call
local settled_here = {} -- ids settled by this call: the same id again is STALE
local held_record, held_lease, held_batch = nil, nil, nil -- the last record that held its lease

local i = 0 -- the items walked
-- A lease call whose ids all settle here, within the lease, is marked DONE whole (buckets.lua):
-- its DONE items need no write of their own. Every other settled item's record is written.
local writes = {} -- field, value, ... of the settled records, for the current bucket
local moved = {} -- per older bucket, the fields written anew in the current one
local marks = {} -- {key, expiry} per lease call marked DONE
if proven_token and shapes == '' then
  -- proven whole, every effect combined (sums, field groups, merged writes) or none: each item
  -- settles, DONE, in the one lease call, which is marked; no item has anything of its own to
  -- walk
  local batch = {token = proven_token, ids = n, deadline = now, bucket = proven_bucket, here = n,
    whole = true}
  local lease = proven_token .. ':' .. proven_attempts
  batches[proven_token] = batch
  setmetatable(batch_of, {__index = function() return batch end})
  setmetatable(leases, {__index = function() return lease end})
  marks[1] = {MARKS .. proven_token, mark_expiry(proven_bucket)}
  i = n
else
  local pos = 1 -- next character of shapes
  for run_lease, run_items in string.gmatch(ARGV[2], '(%x+:%d+)/(%d+)') do
    for _ = 1, tonumber(run_items) do
      local lease = run_lease
      i = i + 1
      local id = ids[i]
      local record = found[i]
      local done = string.byte(outcomes, i) == 68 -- 'D'
      local from, to = pos, pos -- this item's effects are shapes[from, to)
      if shapes ~= '' then
        to = string.find(shapes, ',', pos, true)
        pos = to + 1
      end
      local first_arg, first_key = at, key_at
      if done then
        local p, count = from, 0
        while p < to do
          p, count = effect_at(p)
          at, key_at = at + count, key_at + 1
        end
      else
        at = at + 1
      end

      local batch = nil -- set if the record holds the item's lease
      if record and not settled_here[id] then
        if record == held_record and lease == held_lease then
          batch = held_batch -- the batch's records share one value: the last item's check holds
        else
          local token = string.match(lease, '^%x+')
          local held, attempts, deadline, count =
            string.match(record, '^I:(%x+):(%d+):(%d+):(%d+):')
          if held == token and not marked(token) then -- else: another lease's, or settled already
            batch = batches[token]
            if not batch then
              batch = {token = token, ids = tonumber(count), deadline = tonumber(deadline),
                bucket = where[i], here = 0}
              batches[token] = batch
            end
            if string.find(record, 'I:' .. lease .. ':', 1, true) ~= 1 then
              -- this lease's record, not the caller's attempt count
              lease = token .. ':' .. attempts
            else -- the three together: the next item with this record and lease is in this batch
              held_record, held_lease, held_batch = record, lease, batch
            end
          end
        end
      end
      if not record then
        out[i] = '2'
        refused = true
      elseif not batch then
        out[i] = '1' -- another lease's record, or one already settled
        refused = true
      else
        batch.here = batch.here + 1
        batch_of[i] = batch
        leases[i] = lease
        settled_here[id] = true
        if not done then
          errors[i] = ARGV[first_arg]
        elseif from < to then
          effects[i] = {from, to, first_arg, first_key}
        end
      end
    end
  end

  local done_lease, done_value = nil, nil -- the last DONE record written, and its lease
  for _, batch in pairs(batches) do
    batch.whole = batch.here == batch.ids and now <= batch.deadline
  end
  for item = 1, i do
    local batch = batch_of[item]
    if batch then
      local done = not errors[item]
      if batch.whole and done then
        if not batch.marked then
          batch.marked = true
          marks[#marks + 1] = {MARKS .. batch.token, mark_expiry(batch.bucket)}
        end
      else
        local id = ids[item]
        writes[#writes + 1] = id
        if not done then
          writes[#writes + 1] = 'F:' .. leases[item] .. ':' .. errors[item]
        else
          if leases[item] ~= done_lease then
            done_lease, done_value = leases[item], 'D:' .. leases[item]
          end
          writes[#writes + 1] = done_value
        end
        moving(moved, where[item], current, id)
      end
    end
  end
end

-- The first write goes first, under pcall: at maxmemory (or on a replica, a disk error, too few
-- replicas) Redis refuses a script's first write, and then nothing was written: the call fails
-- whole, no message blamed
local first = nil
if #writes > 0 then
  first = redis.pcall('HSET', prefix .. current, unpack(writes, 1, math.min(CHUNK, #writes)))
elseif #marks > 0 then
  first = redis.pcall('SET', marks[1][1], 'D', 'PXAT', marks[1][2])
end
if type(first) == 'table' and first.err then
  return first
end
in_chunks('HSET', prefix .. current, writes, CHUNK + 1)
for m = #writes > 0 and 1 or 2, #marks do
  redis.call('SET', marks[m][1], 'D', 'PXAT', marks[m][2])
end
if #writes > 0 or #marks > 0 then
  forget_leases(batches) -- their records were written or marked
end

local fixes = {} -- field, value, ... of the items whose effects Redis refused
-- a settled item's effect turned down: the item becomes FAILED with the reason (REJECTED)
local function reject(item, reason)
  fixes[#fixes + 1] = ids[item]
  fixes[#fixes + 1] = 'F:' .. leases[item] .. ':rejected effect: ' .. reason
  if batch_of[item].whole then -- not moved yet: its DONE was the mark
    moving(moved, where[item], current, ids[item])
  end
  out[item] = '3'
  why[item] = reason
  refused = true
end

-- `increment` (a number's text) on the sum: the reply
local function increment_by(sum, increment)
  if sum.command == 'HINCRBY' then
    return redis.pcall('HINCRBY', sum.key, sum.field, increment)
  end
  return redis.pcall('INCRBY', sum.key, increment)
end

for item = 1, i do
  local effect = effects[item]
  if effect then
    local from, to, first_arg, first_key = effect[1], effect[2], effect[3], effect[4]
    local reason = nil
    local p, count, command = effect_at(from)
    if p == to then
      reason = apply_alone(command, KEYS[first_key], first_arg, count)
    else
      reason = apply_checked(from, to, first_arg, first_key)
    end
    if reason then
      reject(item, reason)
    end
  end
end

-- true if every item of the sum settled (no digit yet: none was refused so far)
local function all_settled(sum)
  if refused then
    for position in string.gmatch(sum.positions, '%d+') do
      if out[tonumber(position)] then
        return false
      end
    end
  end
  return true
end

-- `value` (a hash field's, false if absent) plus `increment`, as HINCRBY would leave it, or nil
-- where HINCRBY would refuse it
local function plus(value, increment)
  if value == false then
    return increment -- sent in Redis's own form
  elseif #value < 16 and #increment < 16
      and (value == '0' or string.find(value, '^%-?[1-9]%d*$')) then
    return string.format('%d', tonumber(value) + tonumber(increment)) -- exact below 2^53
  end
  local sum = add('HINCRBY', value, increment)
  if not sum then
    return nil
  end
  local hi, lo = sum[1], sum[2] -- hi * LIMB + lo, 0 <= lo < LIMB
  if hi == 0 then
    return string.format('%d', lo)
  elseif hi > 0 then
    return string.format('%d%010d', hi, lo)
  elseif lo == 0 then
    return string.format('-%d%010d', -hi, 0)
  elseif hi == -1 then
    return string.format('-%d', LIMB - lo)
  end
  return string.format('-%d%010d', -hi - 1, LIMB - lo)
end

-- A field group's settled items: one HMGET of their fields, the sums in Lua, one HSET; or, where
-- HINCRBY would refuse one (the key is no hash, a value no integer, an overflow), each item's
-- HINCRBY in item order, so Redis refuses the very items it would have.
local function apply_group(group)
  local items, fields, increments = {}, {}, {}
  -- every item settled: which they are matters only to a fallback, which reads the positions
  -- then (till then `items` holds false per item)
  local every = not refused
  local positions = string.gmatch(group.positions, '%d+')
  local f = group.fields
  for increment in string.gmatch(group.increments, '%S+') do
    local item = not every and tonumber(positions())
    if every or not out[item] then
      items[#items + 1], fields[#fields + 1], increments[#increments + 1] = item, ARGV[f], increment
    end
    f = f + 1
  end
  local writes = {}
  for from = 1, #fields, CHUNK do
    local to = math.min(from + CHUNK - 1, #fields)
    local values = redis.pcall('HMGET', group.key, unpack(fields, from, to))
    if values.err then
      writes = nil
      break
    end
    for j = from, to do
      local value = plus(values[j - from + 1], increments[j])
      if not value then
        writes = nil
        break
      end
      writes[#writes + 1] = fields[j]
      writes[#writes + 1] = value
    end
    if not writes then
      break
    end
  end
  if writes then
    in_chunks('HSET', group.key, writes)
    return
  end
  if every then
    items = {}
    for position in string.gmatch(group.positions, '%d+') do
      items[#items + 1] = tonumber(position)
    end
  end
  for j = 1, #items do
    local reason = refusal(redis.pcall('HINCRBY', group.key, fields[j], increments[j]))
    if reason then
      reject(items[j], 'HINCRBY on ' .. group.key .. ': ' .. reason)
    end
  end
end

for _, group in ipairs(groups) do
  apply_group(group)
end

-- Each settled item of a merged write in item order: visit(item, its key, its first argument's
-- ARGV index, how many)
local function each_settled(merge, visit)
  local positions = string.gmatch(merge.positions, '%d+')
  local a, k = merge.args, merge.key
  for count in string.gmatch(merge.counts, '%d+') do
    local item = tonumber(positions())
    count = tonumber(count)
    if not out[item] then
      visit(item, KEYS[k], a, count)
    end
    a = a + count
    if merge.code == 'S' then -- a key per item
      k = k + 1
    end
  end
end

-- A merged write's settled items: one MSET, SADD or HSET (in chunks: once the first is taken,
-- so are the others, the key's type being right); where Redis refuses the first, each item's own
-- command in item order, so Redis refuses the very items it would have.
local function apply_merged(merge)
  local each = merge.code == 'S'
  local command = COMMANDS[merge.code]
  local args = {} -- the settled items' arguments, each after its key for an MSET
  if not refused then -- every item settled: the arguments as sent
    for j = 0, merge.count - 1 do
      if each then
        args[#args + 1] = KEYS[merge.key + j]
      end
      args[#args + 1] = ARGV[merge.args + j]
    end
  else
    each_settled(merge, function(_, key, a, count)
      if each then
        args[#args + 1] = key
      end
      for j = a, a + count - 1 do
        args[#args + 1] = ARGV[j]
      end
    end)
  end
  if #args == 0 then
    return
  end
  -- args[from..] in one command, at most CHUNK of them, run with `run` (redis.call or pcall)
  local function write(run, from)
    local to = math.min(from + CHUNK - 1, #args)
    if each then
      return run('MSET', unpack(args, from, to))
    end
    return run(command, KEYS[merge.key], unpack(args, from, to))
  end
  if not refusal(write(redis.pcall, 1)) then
    for from = CHUNK + 1, #args, CHUNK do
      write(redis.call, from)
    end
    return
  end
  each_settled(merge, function(item, key, a, count)
    local reason = apply_alone(command, key, a, count)
    if reason then
      reject(item, reason)
    end
  end)
end

for _, merge in ipairs(merges) do
  apply_merged(merge)
end

for _, sum in ipairs(sums) do
  if not all_settled(sum) or refusal(increment_by(sum, sum.total)) then
    local positions = string.gmatch(sum.positions, '%d+')
    for increment in string.gmatch(sum.increments, '%S+') do
      local item = tonumber(positions())
      if not out[item] then
        local reason = refusal(increment_by(sum, increment))
        if reason then
          reject(item, sum.command .. ' on ' .. sum.key .. ': ' .. reason)
        end
      end
    end
  end
end

in_chunks('HSET', prefix .. current, fixes)
if #writes > 0 or #fixes > 0 then
  kept(prefix, current, width, keep, moved)
end
if not refused then
  return {'', {}}
end
local reasons = {}
for j = 1, i do
  out[j] = out[j] or '0'
  if why[j] then
    reasons[#reasons + 1] = why[j]
  end
end
return {table.concat(out), reasons}
