"""The admin CLI: ``bucketnotify topic list|get|rm|stats|dump`` and
``bucketnotify notification list|get``, the reference's ``radosgw-admin topic`` commands
working from the cluster (custom objects, partition Leases, the delivery service's queues).

``commands`` parses arguments, runs a command and decides its exit code; ``cluster`` reads
(and is the only module here that talks to the API server or the queue store); ``views``
and ``output`` turn what was read into documents, rows and text. It may not import the
controller nor the delivery service's processing: it works while they are down, and it
changes nothing but the Topic ``topic rm`` deletes.
"""

from bucketnotify.admin.commands import COMMANDS, register, run

__all__ = ["COMMANDS", "register", "run"]
