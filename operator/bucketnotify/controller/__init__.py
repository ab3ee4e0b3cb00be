"""kopf handlers that reconcile Topics and BucketNotifications into the gateway.

Logic only: talks to the gateway through ``bucketnotify.gateway``, never with boto3 directly.
"""

__all__: list[str] = []
