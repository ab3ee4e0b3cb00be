"""The import-linter contracts keep up with the package: a new delivery room (or model
module) is covered by the rule that keeps the controller to the delivery's endpoints, and
the delivery's layers name each room once.

(The two layers contracts are ``exhaustive``: import-linter itself fails on a module they
do not name. A forbidden contract has no such switch, hence this test.)
"""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DELIVERY = ROOT / "operator" / "bucketnotify" / "delivery"


def _listed(contract: str, field: str) -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return set(config[f"importlinter:contract:{contract}"][field].split())


ENDPOINTS_SPEAK = {"event", "push"}
"""The model modules the endpoints import (an event's object, a push and its outcome): the
controller reaches them through the endpoints, so they cannot be forbidden to it."""


def test_the_controller_is_kept_from_every_delivery_room_but_the_endpoints() -> None:
    rooms = {
        f"bucketnotify.delivery.{path.stem}"
        for path in DELIVERY.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    assert "bucketnotify.delivery.ingest" in rooms  # the listing found the rooms
    model = {
        f"bucketnotify.delivery.model.{path.stem}"
        for path in (DELIVERY / "model").glob("*.py")
        if path.stem not in {"__init__", *ENDPOINTS_SPEAK}
    }
    forbidden = _listed("controller-not-delivery-internals", "forbidden_modules")
    expected = rooms - {"bucketnotify.delivery.endpoints", "bucketnotify.delivery.model"}
    assert forbidden == expected | model


def test_the_delivery_layers_name_every_room_once() -> None:
    rooms = {
        path.stem
        for path in DELIVERY.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    layers = [
        room.strip()
        for line in _listed_lines("delivery-layers", "layers")
        for room in line.split("|")
    ]
    assert sorted(layers) == sorted(rooms)
    assert len(_listed_lines("delivery-layers", "layers")) <= 9  # the service and 8 layers


def _listed_lines(contract: str, field: str) -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    value = config[f"importlinter:contract:{contract}"][field]
    return [line.strip() for line in value.splitlines() if line.strip()]
