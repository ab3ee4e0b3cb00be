"""Types shared by every custom resource: references, conditions, the base model."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic.alias_generators import to_camel

GROUP = "bucketnotify.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


class Model(BaseModel):
    """Base of every API model: camelCase on the wire, docstrings become the CRD's descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        frozen=True,
        extra="ignore",
    )


class SecretKeyRef(Model):
    """One key of a Secret in the object's own namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Name of the Secret."""
    key: str = Field(min_length=1, max_length=253)
    """Key inside the Secret."""


class CARef(Model):
    """A PEM CA bundle from a ConfigMap or a Secret in the object's namespace."""

    kind: Literal["ConfigMap", "Secret"] = "ConfigMap"
    """Where the bundle is kept."""
    name: str = Field(min_length=1, max_length=253)
    """Name of the ConfigMap or Secret."""
    key: str = Field(default="ca.crt", min_length=1, max_length=253)
    """Key holding the PEM bundle."""


class CredentialsRef(Model):
    """User name and password kept in a Secret, never inline in the object."""

    secret_name: str = Field(min_length=1, max_length=253)
    """Name of the Secret in the object's namespace."""
    username_key: str = Field(default="username", min_length=1, max_length=253)
    """Key of the user name in the Secret."""
    password_key: str = Field(default="password", min_length=1, max_length=253)
    """Key of the password in the Secret."""


class ClientCertificateRef(Model):
    """A client certificate and its private key, kept in a Secret (of type
    ``kubernetes.io/tls`` as cert-manager writes them), never inline in the object."""

    secret_name: str = Field(min_length=1, max_length=253)
    """Name of the Secret in the object's namespace."""
    certificate_key: str = Field(default="tls.crt", min_length=1, max_length=253)
    """Key of the PEM certificate (and the intermediates after it) in the Secret."""
    private_key_key: str = Field(default="tls.key", min_length=1, max_length=253)
    """Key of the PEM private key in the Secret."""
    key_password_key: str | None = Field(default=None, min_length=1, max_length=253)
    """Key of the private key's password in the Secret, when the key is encrypted."""


class GatewaySecretKeys(Model):
    """The key names of a gateway Secret made by another tool, where they differ from ours."""

    endpoint: str = Field(default="endpoint", min_length=1, max_length=253)
    """Key of the gateway's URL."""
    access_key: str = Field(default="accessKey", min_length=1, max_length=253)
    """Key of the access key."""
    secret_key: str = Field(default="secretKey", min_length=1, max_length=253)
    """Key of the secret key."""
    region: str = Field(default="region", min_length=1, max_length=253)
    """Key of the region (the zonegroup name); optional in the Secret."""


ROOK_USER_SECRET_KEYS = GatewaySecretKeys(
    endpoint="Endpoint",
    access_key="AccessKey",
    secret_key="SecretKey",  # noqa: S106  # a key name, not a secret
)
"""The keys of the Secret Rook makes for a CephObjectStoreUser."""


class GatewayRef(Model):
    """Which gateway and whose credentials, overriding the operator's default connection.

    The Secret holds `endpoint` (URL of the gateway), `accessKey`, `secretKey` and
    optionally `region` (the zonegroup name). A Secret Rook made for a CephObjectStoreUser
    (`Endpoint`, `AccessKey`, `SecretKey`) is read as it is; for other key names, set
    `keys`.
    """

    secret_name: str = Field(min_length=1, max_length=253)
    """Name of the Secret in the object's namespace."""
    keys: GatewaySecretKeys | None = None
    """The Secret's key names, where they are neither ours nor Rook's."""


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(Model):
    """A Kubernetes API convention condition."""

    type: str = Field(max_length=316)
    """Type of the condition, e.g. Ready."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(max_length=1024)
    """CamelCase reason of the last transition."""
    message: str = Field(default="", max_length=32768)
    """What happened, in words a person can act on."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation this condition was computed from."""
    last_transition_time: dt.datetime
    """When status last changed."""


def conditions_field() -> Any:
    """The ``conditions`` of a status: a list keyed by ``type`` for the API server
    (``x-kubernetes-list-type: map``), so server-side apply merges the conditions of several
    field managers by type instead of one manager's list replacing the other's."""
    return Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )


def cel_rules(*rules: dict[str, str]) -> ConfigDict:
    """CEL validation rules of the API server (x-kubernetes-validations) for one object."""
    # pydantic merges this with the base model's config.
    validations: list[JsonValue] = [dict(rule) for rule in rules]
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": validations})


class NotReconcilable(Exception):
    """The object cannot be reconciled as it is: ``reason`` is its Ready condition's reason
    (``retry``: it may become reconcilable without a change, such as a Secret made later).
    Raised by the operator's handlers and by the admission webhook alike."""

    def __init__(self, reason: str, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry = retry


M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], spec: dict[str, Any]) -> M:
    """The spec as ``model``; the CRD schema should have refused an invalid one already, so
    say which fields are wrong, not their values (which may be secrets)."""
    try:
        return model.model_validate(spec)
    except ValidationError as exc:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        raise NotReconcilable("InvalidSpec", f"spec is invalid at: {fields}") from None
