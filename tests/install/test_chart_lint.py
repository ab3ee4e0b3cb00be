"""What `ct lint` (chart-testing) checks, with chart-testing's own rules: its Chart.yaml
schema (through yamale, as ct runs it) and its yamllint configuration on Chart.yaml and
values.yaml; `helm lint` runs in `make lint`. chart-testing itself is a Go program whose
module the Go proxy does not serve here, so ct's two files are kept in
tests/install/chart_testing/ (see SOURCE there) and run by the same tools ct calls.

Left out, as `ct lint` is usually run outside a release pipeline: the version-increment
check against the target branch (tests/unit/test_chart_metadata.py checks one version
everywhere instead) and the maintainers' GitHub accounts (no network here)."""

from __future__ import annotations

from pathlib import Path

import yamale
from yamllint import config, linter

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "bucketnotify"
CT = Path(__file__).parent / "chart_testing"


def test_chart_yaml_fits_chart_testings_schema() -> None:
    schema = yamale.make_schema(str(CT / "chart_schema.yaml"))
    # Strict, as the yamale command ct runs: a key the schema does not know is an error.
    yamale.validate(schema, yamale.make_data(str(CHART / "Chart.yaml")), strict=True)


def test_chart_and_values_pass_chart_testings_yamllint_rules() -> None:
    rules = config.YamlLintConfig(file=str(CT / "lintconf.yaml"))
    files = [CHART / "Chart.yaml", CHART / "values.yaml", *sorted(CHART.glob("ci/*.yaml"))]
    problems = [
        f"{path.relative_to(ROOT)}:{problem.line}:{problem.column} {problem.message}"
        for path in files
        for problem in linter.run(path.read_text(), rules, str(path))
        # ct fails on yamllint's errors; its warnings (truthy) are printed, not fatal.
        if problem.level == "error"
    ]
    assert not problems, "\n".join(problems)


def test_a_chart_yaml_with_a_key_ct_does_not_know_is_refused(tmp_path: Path) -> None:
    """The check can fail: ct's schema refuses what a Chart.yaml may not hold."""
    bad = tmp_path / "Chart.yaml"
    bad.write_text((CHART / "Chart.yaml").read_text() + "maintainer: someone\n")
    schema = yamale.make_schema(str(CT / "chart_schema.yaml"))
    try:
        yamale.validate(schema, yamale.make_data(str(bad)), strict=True)
    except yamale.YamaleError as refused:
        assert "maintainer" in str(refused)
    else:
        raise AssertionError("ct's schema took an unknown key")
