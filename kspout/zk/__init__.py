"""ZooKeeper the kazoo way: one session, and recipes that take it.

`session.ZkSession` is the kazoo client of one spout's tree, `<zk_root>/<spout_id>`, with the
one retry idiom every request goes through; the recipes each own a part of the tree::

    <zk_root>/<spout_id>/partition_<n>          the offset record (`record`, `offsets`)
    <zk_root>/<spout_id>/owners/partition_<n>   the ownership claim (`claims`)
    <zk_root>/<spout_id>/instances/<id>         the instance registry (`registry`)

`kspout.ownership` adds the assignment and the pauses, through the same session.
"""
