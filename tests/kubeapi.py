"""An API client (kubernetes_asyncio, the operator's own library) for a kubeconfig."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from kubernetes_asyncio import client, config


@contextlib.asynccontextmanager
async def api_client(kubeconfig: str) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield api
