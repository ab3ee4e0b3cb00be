"""The servers tests, benchmarks and the demo put beside the real services: endpoints
that take notifications, and network pieces between our processes.

- ``recording``: ``RecordingHttpServer``, an HTTP(S) endpoint in the test's process whose
  answer (status, delay) the test changes while it runs and whose requests it reads in
  full (headers, connection reuse, requests in flight); ``HttpReceiver`` queues bodies.
- ``arrivals``: an endpoint that notes when each event arrived, in a process of its own
  (``Receiver``, the benchmarks' clock) or as a command writing a journal (the demo's).
- ``tcpproxy``: ``TcpProxy``, a forwarder a test takes down and brings back (a network
  outage), and ``Balancer``, round robin over delivery replicas (a Service's part).
- ``process``: ``ServerProcess``, a server in a process of its own that reports its port.

Two HTTP endpoints, not one, because they answer different questions: the recording one
lets a test decide every answer from its own thread and inspect each request; the arrivals
one must not share a GIL with the load it measures.
"""
