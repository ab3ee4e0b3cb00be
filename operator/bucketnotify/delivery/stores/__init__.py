"""Queue stores: the ``QueueStore`` contract of ``delivery.model.queue`` kept on durable storage.

- ``LocalDirStore``: a local directory; the embedded store of a single replica, and tests'.
- ``S3Store``: a bucket on the gateway itself; the cluster default, shared by all replicas.

Both write the same names and bodies (``_format``), so every count ``stats`` and
``reserve`` need can come from a listing (the local store keeps them in a record per shard
as well, checked against the listing whenever it may be stale), and a crash in the middle
of a rewrite is resolved the same way. Both run their blocking I/O in threads of their own
(``_threads``), never in the event loop's shared default executor.
"""

from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.stores.s3 import S3Store

__all__ = ["LocalDirStore", "S3Store"]
