"""The import-linter contracts keep up with the package: a new delivery module is covered
by the rule that keeps the controller to the delivery's endpoints.

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


def test_the_controller_is_kept_from_every_delivery_module_but_the_endpoints() -> None:
    modules = {
        f"bucketnotify.delivery.{path.stem}"
        for path in DELIVERY.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    assert "bucketnotify.delivery.ingest" in modules  # the listing found the modules
    forbidden = _listed("controller-not-delivery-internals", "forbidden_modules")
    assert forbidden == modules - {"bucketnotify.delivery.endpoints"}
