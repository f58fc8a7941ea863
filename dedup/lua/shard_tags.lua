-- shard_tags.lua: fix the hash tags of a namespace's partitions on a Redis Cluster, once each.
--
-- KEYS[1]  the namespace's shard map `{<namespace>}:shards`, a hash: partition -> tag
-- ARGV     pairs: a partition (decimal), the tag the caller proposes for it (chosen by slot for
--          the cluster as the caller sees it: dedup/shards.py)
--
-- A partition without a tag gets the one proposed; a partition with one keeps it, so a tag never
-- changes once set (its records, fence and effect keys stay under it), and two callers
-- proposing at once agree on the first tag written.
-- Returns the partitions' tags, in ARGV's order.

local tags = {}
for i = 1, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  tags[#tags + 1] = redis.call('HGET', KEYS[1], ARGV[i])
end
return tags
