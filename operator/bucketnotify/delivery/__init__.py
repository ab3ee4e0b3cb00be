"""The delivery service: ingest, persistent queues, Lease-based ownership, the worker, and
the delivery records of what became of each event.

The worker decides what to push and when; endpoints and queue stores are the adapters it
drives; the records writer (``recording``) only observes, and may never hold it up.
"""

__all__: list[str] = []
