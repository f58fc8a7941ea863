"""The executor side: what runs a partition task, in-process or in a Spark Python worker."""
