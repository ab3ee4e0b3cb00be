"""The delivery service: ingest, persistent queues, Lease-based ownership, the worker.

The worker decides what to push and when; endpoints and queue stores are the adapters it
drives.
"""

__all__: list[str] = []
