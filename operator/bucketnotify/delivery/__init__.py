"""The delivery service: the persistent Topics' events from the gateway's push to their
endpoints, through durable queues whose shards the replicas share by Kubernetes Leases.

Its parts are rooms named for the stops of an event, each a subpackage with one idea; an
event passes them in this order, and each room imports only those after it:

- ``ingest``: the gateway's request taken, the Topic's token checked, its events
  committed (group commit) or pushed at once, the answer given; draining on stop.
- ``rounds``: the pushes: a shard loop per owned shard runs rounds (list, push, remove),
  direct pushes for empty shards, the identities of what each shard delivered.
- ``topics``: the Topics this replica serves: the table read from the API server, each
  Topic's endpoint, queue and ingest token, its start and retirement.
- ``peers``: the other replicas: who owns which shard (Leases), gone members, hand-over
  of requests (forwarding), wake-ups.
- ``recorded``: what is made of each outcome: metrics, delivery records and where they
  are written, Kubernetes Events on the Topic.
- ``endpoints`` and ``stores``: the adapters: where events go (HTTP, AMQP, Kafka) and
  where they wait (a directory, a bucket).
- ``model``: what they all speak: the queue contract, an event's identity, object and
  shard, a push and its outcome, the service's timings.

``service`` builds the rooms and wires them; nothing else does. docs/architecture.md
walks the same path.
"""

__all__: list[str] = []
