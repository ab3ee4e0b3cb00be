"""HTTP(S) endpoint: POST of a JSON body; any 2xx is an acknowledgement."""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["EndpointError", "post_json"]


class EndpointError(Exception):
    """The endpoint did not acknowledge; the message names the cause, never credentials."""


async def post_json(
    url: str, body: dict[str, Any], *, verify: bool = True, timeout_s: float = 10.0
) -> None:
    # The gateway's own defaults: 5 s to connect, 10 s for the whole exchange.
    timeouts = httpx.Timeout(timeout_s, connect=min(5.0, timeout_s))
    try:
        async with httpx.AsyncClient(verify=verify, timeout=timeouts) as client:
            response = await client.post(url, json=body)
    except httpx.HTTPError as exc:
        raise EndpointError(f"POST to the endpoint failed: {type(exc).__name__}") from None
    if not response.is_success:
        raise EndpointError(f"the endpoint answered {response.status_code}")
