"""What is made of each outcome, for people and programs looking on.

``accounting`` takes what a round or a direct push did and counts it (metrics), records it
(``delivery_records``, written to a ``record_targets`` directory or bucket), announces it
on the Topic (``kube_events``: Kubernetes Events, not S3 events) and logs it. Nothing here
decides what becomes of an event; a failure here never holds a delivery up.
"""
