"""A drift check writes the status it decided only onto the version of the object it read
(real apiserver, our CRDs): a check that read a Topic before the user edited it must not
write its verdict over the status of the edited one."""

from __future__ import annotations

import pytest

from bucketnotify.kube.objects import Kube
from tests.kubeapi import api_client
from tests.kubectl import Kubectl
from tests.localservices import LocalService

pytestmark = pytest.mark.usefixtures("crds")


async def test_status_is_written_only_onto_the_version_read(
    kube: LocalService, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(
        {
            "apiVersion": "bucketnotify.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "t", "namespace": namespace},
            "spec": {"endpoint": {"http": {"url": "http://127.0.0.1:9/x"}}},
        }
    )
    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        client = Kube(api)
        read = await client.get_object("topics", namespace, "t")
        assert read is not None
        version = read["metadata"]["resourceVersion"]
        assert await client.patch_status("topics", namespace, "t", {"arn": "first"}, version)

        # Changed since it was read (the status write above made a new version).
        assert not await client.patch_status("topics", namespace, "t", {"arn": "stale"}, version)
        now = await client.get_object("topics", namespace, "t")
        assert now is not None and now["status"]["arn"] == "first"
        # The spec stays as the user wrote it: only the status subresource is written.
        assert now["spec"] == read["spec"]

        assert not await client.patch_status("topics", namespace, "gone", {"arn": "x"}, version)
