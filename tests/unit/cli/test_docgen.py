"""docs/configuration.md reads in minutes (design rules): its settings table is generated from cli/settings.py with
one short line per setting, each longer story under a heading of its own that the table links to; no table cell of
the docs is a paragraph; docs/performance.md stays a short report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.cli import docgen, settings

DOCS = Path(__file__).resolve().parents[3] / "docs"
#: The longest cell a table of the docs may hold (the settings table's are held to settings.MAX_CELL): longer is a
#: paragraph, and belongs below its table (docgen puts it there in the files it generates).
MAX_CELL = docgen.MAX_CELL
#: docs/performance.md's length: a report read in minutes; the history is in benchmarks/results/.
MAX_PERFORMANCE_LINES = 300


def _configuration() -> str:
    return (DOCS / "configuration.md").read_text(encoding="utf-8")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _tables(text: str):
    """(line number, cells) of every table row outside code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|") and not set(line) <= set("|-: "):
            yield number, _cells(line)


def test_the_settings_section_of_configuration_md_is_current():
    committed = _configuration()
    assert docgen.render_configuration_md(committed) == committed, (
        "docs/configuration.md is stale: run python -m opentelemetry_instrumentation_vllm_ascend.cli.docgen "
        "--configuration docs/configuration.md"
    )


def test_every_cell_of_the_settings_table_is_one_short_line():
    section = docgen.render_settings_section()
    table = section.split("## Settings in detail")[0]
    rows = list(_tables(table))
    assert len(rows) == len(settings.SETTINGS) + 1  # the header
    for number, cells in rows:
        for cell in cells:
            assert len(cell) <= settings.MAX_CELL, f"settings table row {number}: {len(cell)} characters: {cell}"


#: Docs whose tables still hold paragraphs, and why they are not split yet.
NOT_YET = {
    "metrics.md": "generated from the catalogue's descriptions and the paths' notes: about 100 cells over the limit",
    "architecture.md": "the Layout table's module lists, which tests/unit/test_package_rules.py reads cell by cell",
}


@pytest.mark.parametrize("path", [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_no_table_cell_of_the_docs_is_a_paragraph(path):
    if path.name in NOT_YET:
        pytest.skip(NOT_YET[path.name])
    too_long = [
        f"{path.name} line {number}: {len(cell)} characters: {cell[:60]}…"
        for number, cells in _tables(path.read_text(encoding="utf-8"))
        for cell in cells
        if len(cell) > MAX_CELL
    ]
    assert not too_long, "\n".join(too_long)


def test_the_table_links_each_setting_to_its_details_and_only_there():
    text = _configuration()
    headings = {docgen.anchor(line[4:]) for line in text.splitlines() if line.startswith("### ")}
    for s in settings.SETTINGS:
        name = ", ".join(f"`{n}`" for n in s.names)
        if s.details:
            assert f"[{name}](#{docgen.anchor(name)})" in text and docgen.anchor(name) in headings
        else:
            assert f"| {name} |" in text and f"### {name}\n" not in text


def test_every_switch_of_ours_is_documented():
    """Each OTEL_VLLM_ASCEND_* variable environment.py reads is a row of the settings table or named in a row's
    text (the traces' tail rules in the traces row): a switch added to environment.py needs its Setting."""
    ours = {v for n, v in vars(environment).items() if n.isupper() and isinstance(v, str)}
    ours = {v for v in ours if v.startswith("OTEL_VLLM_ASCEND_")}
    said = " ".join(" ".join((*s.names, s.summary, *s.details)) for s in settings.SETTINGS)
    assert {v for v in ours if not re.search(rf"\b{v}\b", said)} == set()


def test_the_anchor_is_github_s():
    assert docgen.anchor("`OTEL_EXPORTER_OTLP_*`") == "otel_exporter_otlp_"
    assert (
        docgen.anchor("`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`") == "otel_service_name-otel_resource_attributes"
    )
    assert docgen.anchor("GenAI semantic conventions") == "genai-semantic-conventions"


def test_performance_md_reads_in_minutes():
    lines = (DOCS / "performance.md").read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_PERFORMANCE_LINES, f"docs/performance.md has {lines} lines: move history to benchmarks/results/"
