"""The local development stack that tests/, bench/ and demo/ share.

- ``services``: the real services of ``deploy/local/`` (start or reuse, stop, their env files)
- ``programs``: our own ``bucketnotify`` commands as subprocesses, free ports, waiting for one
- ``kubectl``: kubectl against the local apiserver
- ``gateway``: the gateway's test user, as boto3 clients and as our programs' settings
- ``servers``: the endpoints and proxies put beside them (recording, arrivals, TCP proxies)

Plain Python, no pytest: a service that cannot start raises ``ServiceError``;
tests/localservices.py turns that into a test failure (never a skip).
"""
