"""kopf's connection pool counts a connection for every watch stream kopf opens; the
operator scoped to many namespaces (tests/e2e/test_many_namespaces.py) relies on it."""

from __future__ import annotations

import kopf

from bucketnotify.controller.handlers import WATCHED_RESOURCES


def test_every_resource_a_handler_watches_is_counted() -> None:
    # A handler added for a new resource opens a stream per namespace: the pool must count it.
    registry = kopf.get_default_registry()
    selectors = (
        registry._watching.get_all_selectors()
        | registry._changing.get_all_selectors()
        | registry._spawning.get_all_selectors()
        | registry._indexing.get_all_selectors()
    )
    watched = {(s.group or "", s.version, s.any_name) for s in selectors}
    assert watched == set(WATCHED_RESOURCES)
