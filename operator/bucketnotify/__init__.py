"""bucketnotify: bucket notifications for Ceph RGW-compatible gateways, run the Kubernetes way.

Layers, top to bottom (enforced by ``.importlinter`` in ``make lint``):

- command-line entry points
- ``controller`` (kopf handlers) and the delivery worker: the logic
- ``gateway``, ``delivery.endpoints``, queue stores: adapters, the only code that talks to
  the gateway, the brokers, the object store or Kubernetes
- ``api``: pure models, importing nothing of ours
"""

from importlib.metadata import version

__all__ = ["__version__"]

# pyproject.toml is the one place the version is written; the package is always installed.
__version__ = version("bucketnotify")
