"""tests/README.md maps every documented promise to the tests that prove it; this keeps it so.

It fails when a row names no test (and does not say why none can exist), when a row names a
test pytest would not collect, and when a setting, metric, command-line verb or CRD field
exists in the code without a row that covers it. What exists is read from its source, never
from a list kept here: the settings classes, the metrics registries, the argparse parser of
``bucketnotify`` and the CRDs in ``crds/``. Test modules are read with ``ast``, not imported.

What "covered" means for each kind:

- a setting: its variable is in the settings table of docs/operator.md for its class (or,
  for the log settings, which have no table, named in full in the docs), and a row of
  tests/README.md about every setting names a test that enumerates the settings class's
  ``model_fields`` (so that test fails for a setting the chart does not set);
- a metric: its scraped name is in a table of docs/metrics.md and in the promise of a row
  (a ``*`` pattern may stand for several), and a test that row names is in a file that
  mentions the metric's name;
- a command-line verb (every leaf of the parser: ``operator``, ``topic stats``, ...): the
  promise of a row names it, after an optional ``bucketnotify``, with alternatives written
  ``topic list/get``;
- a CRD field: its name is in docs/operator.md and in the promise of a row of that file's
  table. The fields checked are the properties of ``spec``, of each endpoint kind
  (``spec.endpoint.http.*``, ...) and of ``spec.delivery``, ``spec.filter`` and
  ``spec.filter.key``: the settings a user writes. The properties of references
  (``caRef.key``, ``credentialsRef.secretName``, ``gatewayRef.keys.*``, ...) are the same
  shapes everywhere, are checked by the schema tests, and would make every row list them.

A row that cannot name a test says why in its tests cell, starting with one of
``EXEMPT``: a benchmark's figures, or a gateway behaviour measured once that a test would
repeat only by taking down the shared gateway.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from bucketnotify.cli import build_parser
from bucketnotify.metrics import DeliveryMetrics, OperatorMetrics
from bucketnotify.settings import DeliveryServiceSettings, LogSettings, OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "tests" / "README.md"
DOCS = ROOT / "docs"

EXEMPT = ("not applicable:", "measured, not a test:")

NODE_ID = re.compile(r"`(tests/[\w/]+\.py)((?:::\w+)*)(\[[^\]`]+\])?`")
CODE_SPAN = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    line: int
    doc: str
    promise: str
    tests: str

    def where(self) -> str:
        return f"tests/README.md:{self.line} ({self.promise[:70]})"


def _cells(line: str) -> list[str]:
    """The cells of a table line; a ``|`` inside a code span is text."""
    cells, cell, in_code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    cells.append(cell.strip())
    return cells


@cache
def readme_rows() -> tuple[Row, ...]:
    rows, doc = [], ""
    for number, line in enumerate(README.read_text().splitlines(), start=1):
        if line.startswith("### "):
            doc = line[4:].strip()
        elif line.startswith("| [") and doc:
            cells = _cells(line)
            assert len(cells) == 3, f"tests/README.md:{number}: a row has three cells"
            rows.append(Row(number, doc, cells[1], cells[2]))
    return tuple(rows)


def named_tests(cell: str) -> list[tuple[str, list[str], str]]:
    """(file, [class,] function, parameter id) of each test a tests cell names."""
    return [
        (m.group(1), [p for p in m.group(2).split("::") if p], (m.group(3) or "")[1:-1])
        for m in NODE_ID.finditer(cell)
    ]


def test_the_readme_has_a_table_for_every_doc_it_maps() -> None:
    docs = {r.doc for r in readme_rows()}
    expected = {f"docs/{p.name}" for p in DOCS.glob("*.md")} - {
        # How to run things, not promises about bucketnotify: their claims are the
        # Makefile's and the scripts', run by every test.
        "docs/local-services.md",
        "docs/testing.md",
        "docs/benchmarks.md",
        "docs/performance-notes.md",
        "docs/demo.md",
    }
    assert expected | {"README.md"} <= docs


def test_every_row_names_a_test_or_says_why_none_can() -> None:
    bad = []
    for row in readme_rows():
        tests = row.tests.strip()
        if "none found" in tests.lower():
            bad.append(f"{row.where()}: says 'none found'")
        elif not named_tests(tests) and not tests.startswith(EXEMPT):
            bad.append(f"{row.where()}: names no test ({tests or 'empty'})")
    assert not bad, "\n".join(bad)


@cache
def _module(path: str) -> ast.Module | None:
    file = ROOT / path
    return ast.parse(file.read_text()) if file.is_file() else None


def _test_functions(body: list[ast.stmt]) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {
        n.name: n
        for n in body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test")
    }


def _class_has(path: str, class_name: str, function: str, seen: int = 0) -> bool:
    """The class defines the test, or a base class does (followed through imports of
    ``tests.*`` modules, as pytest collects inherited tests)."""
    tree = _module(path)
    if tree is None or seen > 5:
        return False
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if class_name not in classes:
        return False
    cls = classes[class_name]
    if function in _test_functions(cls.body):
        return True
    imported = {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests")
        for alias in node.names
    }
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            continue
        if base.id in classes:
            if _class_has(path, base.id, function, seen + 1):
                return True
        elif base.id in imported:
            other = imported[base.id].replace(".", "/") + ".py"
            if _class_has(other, base.id, function, seen + 1):
                return True
    return False


def why_not_collected(path: str, parts: list[str], param: str) -> str | None:
    tree = _module(path)
    if tree is None:
        return "no such file"
    if not Path(path).name.startswith("test_"):
        return "pytest collects only test_*.py files"
    if not parts:
        return (
            None
            if _test_functions(tree.body) or "class Test" in ast.unparse(tree)
            else "no test in it"
        )
    if len(parts) == 1:
        classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        if parts[0] not in _test_functions(tree.body) and not (
            parts[0].startswith("Test") and parts[0] in classes
        ):
            return f"no module-level test function or Test class {parts[0]}"
    elif len(parts) == 2:
        if not parts[0].startswith("Test"):
            return f"pytest collects only classes named Test*, not {parts[0]}"
        if not _class_has(path, parts[0], parts[1]):
            return f"class {parts[0]} has no test {parts[1]}"
    else:
        return "too many parts"
    if param and param not in (ROOT / path).read_text():
        return f"no parameter id {param!r} in the file"
    return None


def test_every_named_test_is_one_pytest_collects() -> None:
    bad = []
    for row in readme_rows():
        for path, parts, param in named_tests(row.tests):
            why = why_not_collected(path, parts, param)
            if why:
                node = "::".join([path, *parts]) + (f"[{param}]" if param else "")
                bad.append(f"{row.where()}: {node}: {why}")
    assert not bad, "\n".join(bad)


# --- settings ---------------------------------------------------------------------------------


SETTINGS: list[Any] = [OperatorSettings, DeliveryServiceSettings, LogSettings]


def _prefix(model: Any) -> str:
    return str(model.model_config["env_prefix"])


def _doc_tables(text: str) -> list[tuple[str, list[list[str]]]]:
    """(the header and the three lines before it, rows) of each table of a document."""
    lines = text.splitlines()
    tables, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            context = "\n".join(lines[max(0, i - 3) : i + 1])
            j, body = i + 2, []
            while j < len(lines) and lines[j].startswith("|"):
                body.append(_cells(lines[j]))
                j += 1
            tables.append((context, body))
            i = j
        else:
            i += 1
    return tables


def _first_cell_names(rows: list[list[str]]) -> set[str]:
    return {span for row in rows for span in CODE_SPAN.findall(row[0])}


def test_every_setting_is_in_its_settings_table() -> None:
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    operator_doc = (DOCS / "operator.md").read_text()
    missing = []
    for model in SETTINGS:
        prefix = _prefix(model)
        listed: set[str] = set()
        for context, rows in _doc_tables(operator_doc):
            if f"`{prefix}`" in context:
                listed |= _first_cell_names(rows)
        for name in model.model_fields:
            variable = f"{prefix}{name.upper()}"
            if name.upper() not in listed and f"`{variable}" not in docs:
                missing.append(variable)
    assert not missing, f"settings not in a settings table of docs/operator.md: {missing}"


def _function(path: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    tree = _module(path)
    return None if tree is None else _test_functions(tree.body).get(name)


def test_a_row_maps_every_setting_to_a_test_that_enumerates_them() -> None:
    """The row about every setting names a test that reads each settings class's fields, so
    a setting added to a class is in that test at once."""
    enumerated: set[str] = set()
    for row in readme_rows():
        if "every setting" not in row.promise:
            continue
        for path, parts, _ in named_tests(row.tests):
            function = _function(path, parts[-1]) if len(parts) == 1 else None
            if function is None:
                continue
            source = ast.unparse(function)
            if "model_fields" in source:
                enumerated |= {m.__name__ for m in SETTINGS if m.__name__ in source}
    assert enumerated == {m.__name__ for m in SETTINGS}


# --- metrics ----------------------------------------------------------------------------------


def exported_metrics() -> dict[str, str]:
    """Scraped name (counters with ``_total``) -> the name the code gives it."""
    names = {}
    for registry in (DeliveryMetrics().registry, OperatorMetrics().registry):
        for family in registry.collect():
            scraped = f"{family.name}_total" if family.type == "counter" else family.name
            names[scraped] = family.name
    return names


def test_every_metric_is_documented() -> None:
    documented = set()
    for _, rows in _doc_tables((DOCS / "metrics.md").read_text()):
        documented |= _first_cell_names(rows)
    missing = sorted(set(exported_metrics()) - documented)
    assert not missing, f"metrics not in a table of docs/metrics.md: {missing}"


def _promise_spans(row: Row) -> list[str]:
    return CODE_SPAN.findall(row.promise)


def test_every_metric_has_a_row_whose_test_reads_it() -> None:
    uncovered = []
    for scraped, name in exported_metrics().items():
        rows = [
            r
            for r in readme_rows()
            if any(fnmatch.fnmatchcase(scraped, s) for s in _promise_spans(r))
        ]
        files = {p for r in rows for p, _, _ in named_tests(r.tests)}
        if not any(name in (ROOT / f).read_text() for f in files if (ROOT / f).is_file()):
            uncovered.append(scraped)
    assert not uncovered, f"metrics no row names with a test that reads them: {sorted(uncovered)}"


# --- command-line verbs -----------------------------------------------------------------------


def verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every leaf of the command tree: ('operator',), ('topic', 'stats'), ..."""
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= verbs(sub, (*path, name)) or {(*path, name)}
    return found


def _names_verb(span: str, verb: tuple[str, ...]) -> bool:
    words = span.split()
    for prefix in (["kubectl", "bucketnotify"], ["bucketnotify"]):
        if words[: len(prefix)] == prefix:
            words = words[len(prefix) :]
            break
    return len(words) >= len(verb) and all(
        v in w.split("/") for v, w in zip(verb, words, strict=False)
    )


def test_every_command_line_verb_has_a_row() -> None:
    spans = [(s, r) for r in readme_rows() if named_tests(r.tests) for s in _promise_spans(r)]
    missing = [
        " ".join(verb)
        for verb in sorted(verbs(build_parser()))
        if not any(_names_verb(span, verb) for span, _ in spans)
    ]
    assert not missing, f"commands no row with a test names: {missing}"


# --- CRD fields -------------------------------------------------------------------------------


def crd_fields() -> set[str]:
    """The dotted names of the fields a user writes (see the module's docstring)."""
    fields = set()
    for file in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(file.read_text())
        for version in crd["spec"]["versions"]:
            spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
            for name, schema in spec["properties"].items():
                fields.add(f"spec.{name}")
                if name == "endpoint":
                    for kind, kind_schema in schema["properties"].items():
                        fields |= {
                            f"spec.endpoint.{kind}.{field}" for field in kind_schema["properties"]
                        }
                elif name in ("delivery", "filter"):
                    fields |= {f"spec.{name}.{field}" for field in schema["properties"]}
                    if name == "filter":
                        key = schema["properties"]["key"]["properties"]
                        fields |= {f"spec.filter.key.{field}" for field in key}
    return fields


def test_every_crd_field_is_documented_and_has_a_row() -> None:
    operator_doc = (DOCS / "operator.md").read_text()
    spans = [
        s
        for r in readme_rows()
        if r.doc == "docs/operator.md" and named_tests(r.tests)
        for s in _promise_spans(r)
    ]
    undocumented, uncovered = [], []
    for field in sorted(crd_fields()):
        leaf = field.rsplit(".", 1)[1]
        word = re.compile(rf"(?<![\w-]){re.escape(leaf)}(?![\w-])")
        if not re.search(rf"`[^`]*(?<![\w-]){re.escape(leaf)}(?![\w-])[^`]*`", operator_doc):
            undocumented.append(field)
        if not any(word.search(s) for s in spans):
            uncovered.append(field)
    assert not undocumented, f"CRD fields docs/operator.md does not name: {undocumented}"
    assert not uncovered, f"CRD fields no row of docs/operator.md's table names: {uncovered}"
