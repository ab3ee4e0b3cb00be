"""The ingest: where an event enters the delivery service.

The gateway's ``POST`` for a persistent Topic is taken here (``handler``): its token
checked, its events committed to the Topic's queue (``groupcommit`` shares one store write
among concurrent requests) or pushed at once when their shard is empty
(``delivery.rounds.direct``), or handed to the shard's owner (``delivery.peers.forwarding``);
only then answered. ``draining`` lets kept-alive connections go when the replica stops.
"""
