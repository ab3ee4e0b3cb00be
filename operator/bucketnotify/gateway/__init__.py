"""SNS and S3 client for RGW-compatible gateways.

An adapter: the only code that talks to the gateway's topic and notification APIs. Knows
nothing of Kubernetes or kopf.
"""

__all__: list[str] = []
