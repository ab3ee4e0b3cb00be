"""The HTTP proxy the environment names for a URL, looked up once per client.

aiohttp's ``trust_env=True`` looks up ``$HTTP(S)_PROXY``/``$NO_PROXY`` and parses
``~/.netrc`` again for every request, a cost seen under load (docs/performance-notes.md),
so our clients run with ``trust_env=False`` and pass what this gives as ``proxy``.
"""

from __future__ import annotations

import contextlib

from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

__all__ = ["env_proxy"]


def env_proxy(url: str | URL) -> str | None:
    """``$HTTPS_PROXY`` or ``$HTTP_PROXY`` (by the URL's scheme) unless ``$NO_PROXY``
    exempts the host, with the proxy credentials ``~/.netrc`` holds for it; None when none."""
    with contextlib.suppress(LookupError):
        proxy, auth = get_env_proxy_for_url(URL(url))
        if auth is not None:
            proxy = proxy.with_user(auth.login).with_password(auth.password)
        return str(proxy)
    return None
