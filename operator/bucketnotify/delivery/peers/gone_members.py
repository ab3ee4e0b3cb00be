"""Member Leases of replicas that are gone, deleted by a live replica: each replica that
ever ran, a pod killed or rolled away, would otherwise leave one behind."""

from __future__ import annotations

import datetime as dt
import logging

import aiohttp

from bucketnotify.delivery.peers.leases import (
    ROLE_LABEL,
    Lease,
    LeaseSettings,
    lease_expired,
    lease_holder,
    lease_labels,
)
from bucketnotify.kube.apiserver import ApiClient, ApiError, lease_path

__all__ = ["GoneMembers"]

# The ownership's logger: these lines came from there before they had a module.
log = logging.getLogger("bucketnotify.delivery.peers.ownership")


class GoneMembers:
    """Deletes the member Leases of a group that stayed expired too long."""

    def __init__(self, api: ApiClient, identity: str, settings: LeaseSettings) -> None:
        self._api = api
        self.identity = identity
        self.settings = settings
        self._warned = False

    async def forget(self, items: list[Lease], now: dt.datetime) -> None:
        """Delete the member Leases that stayed expired for ``member_gone_after_s``: each
        replica that ever ran, a pod killed or rolled away, would otherwise leave one. Only
        at the Lease's resourceVersion, so a replica of that name renewing meanwhile keeps
        it; of several replicas deleting the same one, the first does it."""
        gone_before = now - dt.timedelta(seconds=self.settings.member_gone_after_s)
        for lease in items:
            if (
                lease_labels(lease).get(ROLE_LABEL) != "member"
                or lease_holder(lease) == self.identity
                or not lease_expired(lease, gone_before)
            ):
                continue
            meta = lease["metadata"]
            try:
                await self._api.delete(
                    lease_path(self.settings.namespace, meta["name"]),
                    body={"preconditions": {"resourceVersion": meta["resourceVersion"]}},
                    request_timeout=self.settings.renew_deadline_s,
                )
            except ApiError as exc:
                if exc.status in (404, 409):
                    continue  # gone already, or written again since it was listed
                # Housekeeping only (a Role without `delete leases`, an API server that
                # refuses): the round's renewals must not fail for it.
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "cannot delete the member Leases of replicas that are gone (%s);"
                        " they stay until deleted by hand",
                        exc,
                    )
                return
            except (TimeoutError, OSError, aiohttp.ClientError):
                return  # the next round tries again
            log.info(
                "deleted the member Lease %s of a replica gone since %s",
                meta["name"],
                lease["spec"].get("renewTime") or "it was released",
            )
