"""kubectl against the local apiserver: tests apply objects exactly as a user would.

The one in devstack/kubectl.py; its failures are AssertionErrors, so a test shows them as
its own failure.
"""

from __future__ import annotations

from devstack.kubectl import Kubectl, KubectlError

__all__ = ["Kubectl", "KubectlError"]
