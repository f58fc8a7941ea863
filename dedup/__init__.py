"""Redis idempotency bolt: exactly-once effects across replays, crashes and timeouts.

Built in a later issue; see ../shared/design.md, section "dedup".
"""
