-- advance_epoch.lua: move the namespace's fence to a newer epoch, never to an older one.
--
-- KEYS[1]  the fence hash `{ns}:fence` (fields `epoch`, `seq`; see lease.lua)
-- ARGV[1]  a fresh epoch (decimal) the caller just took from ZooKeeper
--
-- If the fence is missing or holds a lower epoch, it becomes {epoch = ARGV[1], seq = 0}: the
-- counter restarts under an epoch no token has used. An equal or higher epoch is left alone
-- (another client got there first, and restarting its counter would repeat its tokens).
-- Returns the fence's epoch after the call (an integer).

local current = tonumber(redis.call('HGET', KEYS[1], 'epoch'))
local wanted = tonumber(ARGV[1])
if current and current >= wanted then
  return current
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'seq', '0')
return wanted
