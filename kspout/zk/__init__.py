"""ZooKeeper the kazoo way: a session (`session`) and the recipes that take it."""
