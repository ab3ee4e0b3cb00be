"""bucketnotify: bucket notifications for Ceph RGW-compatible gateways, run the Kubernetes way.

Layers, top to bottom (enforced by ``.importlinter`` in ``make lint``):

- command-line entry points
- ``controller`` (kopf handlers) and the delivery worker: the logic
- ``gateway``, ``delivery.endpoints``, queue stores: adapters, the only code that talks to
  the gateway, the brokers, the object store or Kubernetes
- ``api``: pure models, importing nothing of ours
"""

__all__ = ["__version__"]

__version__ = "0.1.0.dev0"
