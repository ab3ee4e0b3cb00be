"""The validating admission webhook: what the CRD schema and its CEL rules cannot see,
answered at ``kubectl apply`` time instead of as a condition after the fact.

Refused (the apply fails with the message):

- a BucketNotification whose ``filter.key.regex`` is outside the gateway's regex dialect
  (``gateway.key_regex``): the gateway compiles it only at the next upload, and Ceph 16.2
  aborts on one it cannot compile;
- a spec the operator's own models refuse (a CRD older than the operator, say).

Warned about (the apply succeeds and kubectl prints ``Warning: ...``): references to objects
that do not exist yet: the Topic of a ``topicRef``, the Secrets of ``gatewayRef`` and
``credentialsRef``, the ConfigMap or Secret of ``caRef``, a ``deadLetterTopic``. Not
refused, because a GitOps tool or ``kubectl apply -f dir/`` creates related objects in an
order of its own; the operator reports a reference still missing as a condition.

Every replica serves it (the leader election only decides who reconciles), over HTTPS with
the certificate in ``WEBHOOK_CERT_DIR`` (``tls.crt``, ``tls.key``), re-read when the files
change so a rotated certificate needs no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from bucketnotify.api.common import NotReconcilable, parse_model
from bucketnotify.api.notification import BucketNotificationSpec
from bucketnotify.api.topic import TopicSpec
from bucketnotify.gateway.key_regex import regex_problem

__all__ = ["PATH", "Exists", "Verdict", "admission_app", "review", "serve_admission"]

log = logging.getLogger(__name__)

PATH = "/validate"

Exists = Callable[[str, str, str], Awaitable[bool]]
"""(kind, namespace, name) → whether the object exists: kind is Topic, Secret or ConfigMap."""

CERT_POLL_SECONDS = 30.0


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str | None = None
    warnings: list[str] = field(default_factory=list)


async def review(kind: str, namespace: str, raw_spec: dict[str, Any], exists: Exists) -> Verdict:
    """The verdict on a Topic or BucketNotification ``spec`` about to be written."""
    try:
        if kind == "BucketNotification":
            return await _review_notification(namespace, raw_spec, exists)
        if kind == "Topic":
            return await _review_topic(namespace, raw_spec, exists)
    except NotReconcilable as refused:
        return Verdict(False, str(refused))
    # The webhook configuration names only the two kinds; anything else is not ours to judge.
    return Verdict(True)


async def _review_notification(namespace: str, raw: dict[str, Any], exists: Exists) -> Verdict:
    spec = parse_model(BucketNotificationSpec, raw)
    key = spec.filter.key if spec.filter is not None else None
    if key is not None and key.regex:
        problem = regex_problem(key.regex)
        if problem:
            return Verdict(False, f"spec.{problem}")
    wanted: list[tuple[str, str, str]] = []
    if spec.topic_ref is not None:
        wanted.append(("Topic", spec.topic_ref.name, "spec.topicRef"))
    if spec.gateway_ref is not None:
        wanted.append(("Secret", spec.gateway_ref.secret_name, "spec.gatewayRef"))
    return Verdict(True, warnings=await _missing(namespace, wanted, exists))


async def _review_topic(namespace: str, raw: dict[str, Any], exists: Exists) -> Verdict:
    spec = parse_model(TopicSpec, raw)
    wanted: list[tuple[str, str, str]] = []
    if spec.gateway_ref is not None:
        wanted.append(("Secret", spec.gateway_ref.secret_name, "spec.gatewayRef"))
    if (credentials := spec.endpoint.credentials_ref()) is not None:
        wanted.append(("Secret", credentials[0].secret_name, credentials[1]))
    if (ca := spec.endpoint.ca_ref()) is not None:
        wanted.append((ca[0].kind, ca[0].name, ca[1]))
    if (client := spec.endpoint.client_certificate_ref()) is not None:
        wanted.append(("Secret", client[0].secret_name, client[1]))
    if spec.delivery is not None and spec.delivery.dead_letter_topic:
        wanted.append(("Topic", spec.delivery.dead_letter_topic, "spec.delivery.deadLetterTopic"))
    return Verdict(True, warnings=await _missing(namespace, wanted, exists))


async def _missing(namespace: str, wanted: list[tuple[str, str, str]], exists: Exists) -> list[str]:
    found = await asyncio.gather(*(exists(kind, namespace, name) for kind, name, _ in wanted))
    return [
        f"{where}: {kind} {namespace}/{name} does not exist (yet); the object is not Ready"
        " until it does"
        for (kind, name, where), there in zip(wanted, found, strict=True)
        if not there
    ]


def _response(uid: str, verdict: Verdict) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.message is not None:
        response["status"] = {"code": 422, "reason": "Invalid", "message": verdict.message}
    if verdict.warnings:
        response["warnings"] = verdict.warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def admission_app(exists: Exists) -> web.Application:
    """``POST /validate``: an AdmissionReview (v1) in, its answer out."""

    async def validate(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            admission = body["request"]
            uid = str(admission["uid"])
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "not an AdmissionReview"}, status=400)
        obj = admission.get("object") or {}
        old = admission.get("oldObject") or {}
        if (
            admission.get("operation") == "DELETE"
            or not isinstance(obj.get("spec"), dict)
            # A change of metadata only (the operator's finalizers and annotations, a label):
            # nothing new to judge, and refusing it would leave an object stored before the
            # webhook, say with a bad regex, unable to lose its finalizer and be deleted.
            or (admission.get("operation") == "UPDATE" and old.get("spec") == obj["spec"])
        ):
            return web.json_response(_response(uid, Verdict(True)))
        kind = str((admission.get("kind") or {}).get("kind", obj.get("kind", "")))
        namespace = str(admission.get("namespace") or obj.get("metadata", {}).get("namespace"))
        try:
            verdict = await review(kind, namespace, obj["spec"], exists)
        except Exception:
            # An API server error while looking up references: let the object through
            # rather than fail the apply; the operator reports it as a condition.
            log.exception("admission review of %s %s failed", kind, namespace)
            verdict = Verdict(True, warnings=["bucketnotify could not check the references"])
        if not verdict.allowed:
            log.info("refused %s %s/%s: %s", kind, namespace, _name(obj), verdict.message)
        return web.json_response(_response(uid, verdict))

    app = web.Application(client_max_size=4 * 1024**2)
    app.router.add_post(PATH, validate)
    return app


def _name(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("name") or metadata.get("generateName") or "")


class _CertificateFiles:
    """The server's TLS context, loaded again when ``tls.crt`` or ``tls.key`` change (a
    certificate rotated by cert-manager or by a helm upgrade): new handshakes use it."""

    def __init__(self, directory: Path) -> None:
        self._cert, self._key = directory / "tls.crt", directory / "tls.key"
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._loaded = self._stamp()
        self.context.load_cert_chain(self._cert, self._key)

    def _stamp(self) -> tuple[float, float]:
        return (self._cert.stat().st_mtime, self._key.stat().st_mtime)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(CERT_POLL_SECONDS)
            try:
                stamp = self._stamp()
                if stamp != self._loaded:
                    self.context.load_cert_chain(self._cert, self._key)
                    self._loaded = stamp
                    log.info("webhook certificate reloaded from %s", self._cert)
            except (OSError, ssl.SSLError) as exc:
                # Half-written files during a rotation: the old certificate stays until the
                # next look.
                log.warning("webhook certificate not reloaded: %s", exc)


@dataclass
class AdmissionServer:
    runner: web.AppRunner
    watcher: asyncio.Task[None]

    async def stop(self) -> None:
        self.watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.watcher
        await self.runner.cleanup()


async def serve_admission(port: int, cert_dir: str, exists: Exists) -> AdmissionServer:
    """Serve :func:`admission_app` over HTTPS on every address at ``port``."""
    certificate = _CertificateFiles(Path(cert_dir))
    runner = web.AppRunner(admission_app(exists), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, None, port, ssl_context=certificate.context).start()
    watcher = asyncio.create_task(certificate.watch(), name="webhook certificate")
    return AdmissionServer(runner, watcher)
