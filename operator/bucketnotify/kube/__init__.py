"""The Kubernetes client side of both programs: the API server client (``apiserver``: its
connection, credentials and retries), reads and writes of the objects we use
(``objects``: Secrets, ConfigMaps, annotations, status), Kubernetes Events
(``event_recorder``) and the operator's leader election (``leadership``)."""
