"""Queue stores: the ``QueueStore`` contract of ``delivery.queue`` kept on durable storage.

- ``LocalDirStore``: a local directory; the embedded store of a single replica, and tests'.
- ``S3Store``: a bucket on the gateway itself; the cluster default, shared by all replicas.

Both write the same names and bodies (``_format``), so every count ``stats`` and
``reserve`` need comes from a listing, and a crash in the middle of a rewrite is resolved
the same way.
"""

from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.stores.s3 import S3Store

__all__ = ["LocalDirStore", "S3Store"]
