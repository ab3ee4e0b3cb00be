"""API clients of the operator's own kind (``bucketnotify.kube.apiserver``) for the tests."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import AsyncIterator, Iterator

import kopf

from bucketnotify.kube import apiserver
from bucketnotify.kube.apiserver import ApiClient

UNREACHABLE = "http://127.0.0.1:9"
"""An API server nobody answers for (the discard port): for objects that need a client
but are not meant to reach one."""


@contextlib.contextmanager
def _kubeconfig_env(kubeconfig: str) -> Iterator[None]:
    saved = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = kubeconfig
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved


@contextlib.asynccontextmanager
async def api_client(kubeconfig: str) -> AsyncIterator[ApiClient]:
    """A client of the API server and user that ``kubeconfig`` names, made as the operator
    makes its own (``apiserver.connect()`` with $KUBECONFIG set to it)."""
    with _kubeconfig_env(kubeconfig):
        api = await apiserver.connect()
    async with api:
        yield api


@contextlib.asynccontextmanager
async def unreachable_api() -> AsyncIterator[ApiClient]:
    """A client whose requests fail (connection refused), closed afterwards."""
    async with ApiClient(kopf.ConnectionInfo(server=UNREACHABLE)) as api:
        yield api


def parse_micro_time(text: str) -> dt.datetime:
    """The moment of a Lease's ``renewTime`` or ``acquireTime`` (timezone-aware)."""
    return dt.datetime.fromisoformat(text)
