"""The other replicas: sharing the shards and telling each other.

``ownership`` takes and renews the partition Leases (``leases`` names and reads them), so
that each shard has one owner; ``gone_members`` removes the member Leases of replicas that
died; ``forwarding`` hands a request to the owner of its shard; ``wakeups`` tells an owner
that its sleeping shard has new entries.
"""
