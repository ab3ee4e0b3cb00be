"""What every room of the delivery service speaks, importing none of them.

``queue``: the queue store contract (names, entries, reservations, limits, errors);
``event``: an S3 event's identity, object and shard; ``push``: one event to push and what
became of it; ``outcomes``: the verdict on a push, expiry and drops; ``delivered_ids``:
the identities a shard delivered last; ``timings``: how often the service does what.
"""
