-- settle_effects.lua: settle.lua plus side effects, each applied only with its item's DONE.
--
-- KEYS[1..n]   record keys `{ns}:r:<id>` (record layout: see claim.lua)
-- KEYS[n+1..]  the effects' keys (the caller's own keys, not namespaced), in order
-- ARGV[1]      how long DONE and FAILED records are kept, ms
-- ARGV[2]      the n tokens (hex) the caller's claims got, space-separated, in KEYS order
-- ARGV[3]      n characters, one per item: 'D' for DONE, 'F' for FAILED
-- ARGV[4]      the effects' shapes: per item, one letter and an argument count per effect, then
--              ','; e.g. 'H2,,A2S1,' is HINCRBY (field, n) for item 1, nothing for item 2, SADD
--              with two members and SET for item 3. Letters: S SET, I INCRBY, H HINCRBY,
--              A SADD, T HSET; any other character is an error reply before anything is written
-- ARGV[5..]    per item in order: the error text of a FAILED item, the effects' arguments
--              (after the key) of a DONE item
--
-- An item whose record is IN_FLIGHT with exactly its token runs its effects and becomes DONE in
-- this call, so a stale token applies nothing. Before writing, each effect of the item is
-- checked against its key's current type and value (one O(1) read); an effect Redis would
-- reject (INCRBY on a hash or on text, ...) leaves the item's effects unapplied and the record
-- FAILED with the reason as its error. (Effects of one item are checked against the data as it was before that
-- item: an item whose own effects conflict, e.g. SET k 'x' then INCRBY k, is not caught, nor
-- an increment that overflows 64 bits; Redis then fails the call after the items before it.)
-- Returns one digit per item: 0 settled, 1 STALE, 2 LOST (see settle.lua), 3 REJECTED.

local COMMANDS = {S = 'SET', I = 'INCRBY', H = 'HINCRBY', A = 'SADD', T = 'HSET'}
-- an O(1) read per command that fails with WRONGTYPE if the key holds another type (SET
-- replaces any value, so it needs none)
local PROBES = {INCRBY = 'GET', HINCRBY = 'HGET', SADD = 'SCARD', HSET = 'HLEN'}

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

-- absent, or an integer as Redis parses one (no leading zeros or '+', at most 19 digits)
local function is_integer(value)
  return value == false or value == '0'
    or (#value <= 20 and string.match(value, '^-?[1-9]%d*$') ~= nil)
end

-- nil if `command` can run on `key` with its first argument `arg` now, else why not
local function problem(command, key, arg)
  local probe = PROBES[command]
  if not probe then
    return nil
  end
  local value
  if command == 'HINCRBY' then
    value = redis.pcall(probe, key, arg)
  else
    value = redis.pcall(probe, key)
  end
  if type(value) == 'table' and value.err then
    return command .. ' on ' .. key .. ': ' .. value.err
  end
  if (command == 'INCRBY' or command == 'HINCRBY') and not is_integer(value) then
    return command .. ' on ' .. key .. ': the value is not an integer'
  end
  return nil
end

local ttl = ARGV[1]
local outcomes = ARGV[3]
local pos = 1 -- next character of shapes
local at = 5 -- next ARGV of the stream
local key_at = #outcomes + 1 -- next effect key
local out = {}
local i = 0
for token in string.gmatch(ARGV[2], '%x+') do
  i = i + 1
  local from = pos
  local to = string.find(shapes, ',', pos, true) -- this item's effects are shapes[from, to)
  pos = to + 1
  local done = string.byte(outcomes, i) == 68 -- 'D'
  local first_arg, first_key = at, key_at
  local err = nil
  if done then
    local p, count = from, 0
    while p < to do
      p, count = effect_at(p)
      at, key_at = at + count, key_at + 1
    end
  else
    err = ARGV[at]
    at = at + 1
  end

  local record = redis.call('GET', KEYS[i])
  local prefix = 'I:' .. token .. ':'
  if not record then
    out[i] = '2'
  elseif string.sub(record, 1, #prefix) ~= prefix then
    out[i] = '1'
  else
    local attempts = string.match(record, '^%d+', #prefix + 1)
    local reason = nil
    local p, a, k, command, count = from, first_arg, first_key, nil, 0
    while done and p < to and not reason do
      p, count, command = effect_at(p)
      reason = problem(command, KEYS[k], ARGV[a])
      a, k = a + count, k + 1
    end
    local settled
    if reason then
      settled = 'F:' .. token .. ':' .. attempts .. ':rejected effect: ' .. reason
      out[i] = '3'
    elseif done then
      p, a, k = from, first_arg, first_key
      while p < to do
        p, count, command = effect_at(p)
        redis.call(command, KEYS[k], unpack(ARGV, a, a + count - 1))
        a, k = a + count, k + 1
      end
      settled = 'D:' .. token .. ':' .. attempts
      out[i] = '0'
    else
      settled = 'F:' .. token .. ':' .. attempts .. ':' .. err
      out[i] = '0'
    end
    redis.call('SET', KEYS[i], settled, 'PX', ttl)
  end
end
return table.concat(out)
