-- advance_epoch.lua: move a shard's fence to a newer epoch, never to an older one.
--
-- KEYS[1]  the fence hash `{tag}:fence` (fields `epoch`, `seq`, `bucket`, `keep`; see lease.lua)
-- ARGV[1]  a fresh epoch (decimal) the caller just took from ZooKeeper
-- ARGV[2]  the width of the shard's record buckets (ms), if the fence has none yet
--
-- If the fence is missing or holds a lower epoch, it becomes {epoch = ARGV[1], seq = 0}: the
-- counter restarts under an epoch no token has used. An equal or higher epoch is left alone
-- (another client got there first, and restarting its counter would repeat its tokens). A
-- fence's bucket width, once set, is kept: the records already written are where it says.
-- Returns the fence's epoch after the call (an integer).

redis.call('HSETNX', KEYS[1], 'bucket', ARGV[2])
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch'))
local wanted = tonumber(ARGV[1])
if current and current >= wanted then
  return current
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'seq', '0')
return wanted
