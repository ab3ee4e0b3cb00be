"""The pushes: how a queued or just-received event reaches its endpoint.

``shard_loops`` runs one loop per (queue, shard) this replica owns; each pass is a round of
``worker`` (list, push, remove what was acknowledged, keep order per object). ``direct``
lets the ingest push an event for an empty shard itself, kept in order with the rounds by
its ``ShardGate``, and ``direct_push`` judges and counts such a push as a round would.
``delivered`` saves and reads back the identities a shard delivered, so that what the
gateway sends again after a shard moved is recognised.
"""
