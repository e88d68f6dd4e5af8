"""semconv.py holds the semantic-convention names the package writes: each GenAI name is the installed
opentelemetry-semantic-conventions' own constant of the same name (its private ``_incubating`` modules: only this
test reads them), and no other module of the package spells one of those names as a string."""

import ast
import pathlib

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

from opentelemetry_instrumentation_vllm_ascend import semconv

PACKAGE = pathlib.Path(semconv.__file__).resolve().parent
OURS = {name: getattr(semconv, name) for name in semconv.__all__}


def test_each_genai_name_is_the_semconv_packages_constant():
    genai = {name: value for name, value in OURS.items() if name.startswith("GEN_AI_")}
    assert len(genai) == 20  # 17 attributes, 3 metrics
    for name, value in genai.items():
        theirs = getattr(gen_ai_attributes, name, None) or getattr(gen_ai_metrics, name)
        assert theirs == value, name


def test_the_stable_names_are_the_public_constants():
    assert (semconv.ERROR_TYPE, semconv.HTTP_RESPONSE_STATUS_CODE) == ("error.type", "http.response.status_code")
    assert (semconv.SERVICE_NAME, semconv.SERVICE_INSTANCE_ID) == ("service.name", "service.instance.id")


def test_no_other_module_spells_a_semconv_name():
    values = set(OURS.values())
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "semconv.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in values:
                spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value}")
    assert spelled == []
