"""The Topics a replica serves.

``table`` keeps, for each persistent Topic in scope, what delivery needs of it (its
endpoint, queue, shards, policy, ingest token), read from the API server and refreshed;
``lifecycle`` starts a Topic's shards and retires a deleted Topic once its queue is empty;
``ingest_tokens`` reads the tokens a Topic's ingest URL carries from its Secret.
"""
