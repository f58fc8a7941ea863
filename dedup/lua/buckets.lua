-- buckets.lua: where a shard's records are kept, shared by lease.lua and settle.lua (dedup.scripts
-- puts this text in front of each).
--
-- A shard's records are fields of its buckets, hashes `{tag}:ids:<k>`: bucket k holds the
-- records written from k * width to (k + 1) * width ms of Redis time, and expires whole `keep`
-- ms after its end, so a record lives at least `keep` ms after its last write and at most one
-- width more. A record that is written again moves to the bucket of the time of the write. The
-- fence hash `{tag}:fence` holds the width (field `bucket`, fixed when the fence is made) and the
-- longest `keep` any caller asked for (field `keep`), so callers configured differently still
-- look in every bucket that can hold a record.

local CHUNK = 2000 -- arguments per command built with unpack (Lua's fails at about 8000)

-- The records of `ids[1..#ids]` in the buckets `prefix .. k` from k = `newest` back to the oldest
-- that can still exist: {record or false per position}, {bucket k per found position}.
local function look_up(prefix, ids, newest, width, keep)
  local n = #ids
  local found, where = {}, {}
  local missing = nil -- positions not found yet; nil: all of them (no table built)
  for b = newest, newest - math.ceil(keep / width), -1 do
    local bucket = prefix .. b
    if redis.call('EXISTS', bucket) == 1 then
      local hits = 0
      local count = missing and #missing or n
      for from = 1, count, CHUNK do
        local to = math.min(from + CHUNK - 1, count)
        local values
        if missing then
          local fields = {}
          for j = from, to do
            fields[j - from + 1] = ids[missing[j]]
          end
          values = redis.call('HMGET', bucket, unpack(fields))
        else
          values = redis.call('HMGET', bucket, unpack(ids, from, to))
        end
        for j = from, to do
          local value = values[j - from + 1]
          if value then
            local i = missing and missing[j] or j
            found[i], where[i] = value, b
            hits = hits + 1
          end
        end
      end
      if hits == count then
        missing = {}
        break
      elseif hits > 0 then
        local still = {}
        for j = 1, count do
          local i = missing and missing[j] or j
          if not found[i] then
            still[#still + 1] = i
          end
        end
        missing = still
      end
    end
  end
  if missing == nil then
    for i = 1, n do
      found[i] = false
    end
  else
    for j = 1, #missing do
      found[missing[j]] = false
    end
  end
  return found, where
end

-- `command` on `key` with `args[from..#args]` (from 1 if not given), CHUNK arguments (an even
-- number) at a time
local function in_chunks(command, key, args, from)
  for at = from or 1, #args, CHUNK do
    redis.call(command, key, unpack(args, at, math.min(at + CHUNK - 1, #args)))
  end
end

-- Note in `moved` that `id`'s record, found in bucket `from` (nil: none), is written to bucket
-- `current` now: `kept` then deletes it from `from`.
local function moving(moved, from, current, id)
  if from and from ~= current then
    local fields = moved[from] or {}
    moved[from] = fields
    fields[#fields + 1] = id
  end
end

-- After records `field, value, ...` were written to bucket `current` (HSET): give the bucket its
-- expiry, or a later one if `keep` grew, and delete the moved records (per older bucket k, the
-- fields now in `current`) from where they were.
local function kept(prefix, current, width, keep, moved)
  local bucket = prefix .. current
  local expires = (current + 1) * width + keep
  if redis.call('PEXPIRETIME', bucket) < expires then -- -1: no expiry yet
    redis.call('PEXPIREAT', bucket, string.format('%d', expires))
  end
  for b, fields in pairs(moved) do
    in_chunks('HDEL', prefix .. b, fields)
  end
end

-- A settle call that settled every id of one lease call DONE, within the lease, marks the lease's
-- token instead of rewriting each id's record: the string `{tag}:done:<token hex>`, expiring with
-- the bucket of those records. An IN_FLIGHT record whose token is marked reads as DONE.
local MARKS = string.sub(KEYS[1], 1, -6) .. 'done:' -- `{tag}:fence` -> `{tag}:done:`
local marks = {} -- token -> whether it is marked, as read by this call

local function marked(token)
  local seen = marks[token]
  if seen == nil then
    seen = redis.call('EXISTS', MARKS .. token) == 1
    marks[token] = seen
  end
  return seen
end

-- A lease call that leases every id it is given, all at one attempt, also writes its proof: the
-- string `{tag}:lease:<token hex>`, `<ids>:<attempts>:<bucket>:<digest>` (how many ids, their
-- attempt, the bucket its records went to, the SHA1 of its ids joined by newlines), expiring at
-- the lease's deadline. None is written if an id holds a newline: the joined
-- text then names the ids exactly. A later call that writes a record of that lease (a renewal, a
-- takeover, a settlement) deletes the proof in the same script, so while it exists every id of
-- the lease still holds its IN_FLIGHT record, unsettled: a settle call of exactly those ids, in
-- that order (the same digest), all DONE, settles the lease whole without reading the records
-- back (settle.lua).
local LEASES = string.sub(KEYS[1], 1, -6) .. 'lease:' -- `{tag}:fence` -> `{tag}:lease:`

-- The digest of the ids ARGV[first .. first + n - 1]; if `checked`, nil where one holds a
-- newline. A settle call need not check: its joined ids equal to a proof's (which has n - 1
-- newlines, the n - 1 it joins with) are the same n ids.
local function digest(first, n, checked)
  local joined = table.concat(ARGV, '\n', first, first + n - 1)
  if checked then
    local at = 0
    for _ = 1, n do -- the n - 1 joins, then one more would be in an id
      at = string.find(joined, '\n', at + 1, true)
      if not at then
        break
      end
    end
    if at then
      return nil
    end
  end
  return redis.sha1hex(joined)
end

-- Delete the proofs of the lease calls `tokens` (token -> true) after a write to their records
local function forget_leases(tokens)
  for token in pairs(tokens) do
    redis.call('DEL', LEASES .. token)
  end
end

-- Where a call on the shard of fence KEYS[1] keeps its records: the bucket width and `keep` (the
-- fence's, or `asked` if longer), the buckets' prefix `{tag}:ids:`, the call's ids ARGV[first ..
-- first + n - 1] as a table, Redis's clock (ms) and the bucket of now (or the next one, if it
-- exists already).
local function placed(width_text, keep_text, asked, first, n)
  local width = tonumber(width_text)
  local keep = math.max(tonumber(keep_text or 0), tonumber(asked))
  local ids = {}
  for i = 1, n do
    ids[i] = ARGV[first - 1 + i]
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local prefix = string.sub(KEYS[1], 1, -6) .. 'ids:'
  local current = math.floor(now / width)
  if redis.call('EXISTS', prefix .. (current + 1)) == 1 then
    -- this server's clock is behind the one that made that bucket (a failover, a clock step):
    -- the newest bucket stays the one records are written to and looked up from
    current = current + 1
  end
  return width, keep, prefix, ids, now, current
end
