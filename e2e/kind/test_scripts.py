"""The kind acceptance suite's scripts, checked without Docker: shellcheck, `bash -n`, argument parsing, and the
RLJob that run.sh applies (examples/tiny-cpu.yaml + tiny-cpu.patch.yaml) against admission and KubeRay's CRD.

Running the suite itself needs Docker and kind: `bash e2e/kind/run.sh` (docs/e2e.md).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.fixtures import in_ci, require_tools
from e2e.harness import Tools
from e2e.operator.kuberay_rules import kuberay_checks, kuberay_crd_dir, rayjob_schema_errors
from kuberl.api.contract import (
    ENV_RAY_AUTH_MODE,
    ENV_RAY_AUTH_TOKEN,
    RAY_AUTH_MODE_TOKEN,
    RLJOB_LABEL,
    TOKEN_SECRET_KEY,
)
from kuberl.api.spec import RLJobSpec
from kuberl.api.validation import validate_document
from kuberl.operator.rayjob import render_rayjob

KIND_DIR = Path(__file__).resolve().parent
REPO_ROOT = KIND_DIR.parents[1]
SCRIPTS = sorted(KIND_DIR.glob("*.sh"))
ENTRY_POINTS = [p for p in SCRIPTS if p.name != "lib.sh"]  # lib.sh is sourced, never run
EXAMPLE = REPO_ROOT / "examples" / "tiny-cpu.yaml"
PATCH = KIND_DIR / "tiny-cpu.patch.yaml"
DOCS = REPO_ROOT / "docs" / "e2e.md"
UID = "0b0b0b0b-1111-2222-3333-444444444444"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, what `kubectl patch --type merge` applies."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def kind_rljob() -> dict[str, Any]:
    return merge_patch(yaml.safe_load(EXAMPLE.read_text()), yaml.safe_load(PATCH.read_text()))


def script_setting(name: str) -> str:
    """A `NAME=value` assignment of run.sh's settings block."""
    match = re.search(rf"^{name}=(\S+)", (KIND_DIR / "run.sh").read_text(), re.MULTILINE)
    assert match, f"run.sh sets no {name}"
    return match.group(1)


def test_there_are_scripts() -> None:
    assert {p.name for p in SCRIPTS} >= {"run.sh", "create-cluster.sh", "collect-logs.sh", "lib.sh"}


def test_shellcheck_is_clean() -> None:
    if shutil.which("shellcheck") is None:
        if in_ci():
            pytest.fail("shellcheck not installed (CI=true: apt-get install -y shellcheck)", pytrace=False)
        pytest.skip("shellcheck not installed: apt-get install -y shellcheck")
    result = subprocess.run(
        ["shellcheck", "-x", *(str(p.relative_to(REPO_ROOT)) for p in SCRIPTS)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_parses(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", ENTRY_POINTS, ids=lambda p: p.name)
def test_entry_points_are_strict_executables_with_help(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    # argument parsing runs before anything touches Docker or a cluster
    usage = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert usage.returncode == 0, usage.stderr
    assert f"e2e/kind/{script.name}" in usage.stdout
    wrong = subprocess.run(["bash", str(script), "--no-such-flag"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert wrong.returncode != 0 and "unknown argument: --no-such-flag" in wrong.stderr


def test_the_applied_rljob_passes_admission_and_runs_on_cpu_from_the_loaded_image() -> None:
    doc = kind_rljob()
    assert validate_document(doc) == []
    cluster = doc["spec"]["cluster"]
    assert cluster["device"] == "cpu"
    assert cluster["image"] == script_setting("TRAINER_IMAGE")
    assert cluster["imagePullPolicy"] == "Never"
    values = yaml.safe_load((REPO_ROOT / "charts" / "kuberl" / "values.yaml").read_text())
    assert cluster["serviceAccountName"] == values["trainer"]["serviceAccount"]["name"]
    (volume,) = [v for v in cluster["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == script_setting("DATA_CONFIGMAP")
    (mount,) = [m for m in cluster["volumeMounts"] if m["name"] == volume["name"]]
    # every data file is one of examples/data's files, read from the mounted ConfigMap
    data = doc["spec"]["data"]
    for path in data["trainFiles"] + data["valFiles"]:
        folder, _, file = path.rpartition("/")
        assert folder == mount["mountPath"] and (REPO_ROOT / "examples" / "data" / file).is_file(), path
    # the rest is the example's: the suite tests examples/tiny-cpu.yaml, not a different job
    example = yaml.safe_load(EXAMPLE.read_text())
    for section in ("model", "algorithm", "reward", "batch", "rollout", "actor"):
        assert doc["spec"][section] == example["spec"][section], section


def test_the_applied_rljob_renders_a_rayjob_kuberay_accepts() -> None:
    doc = kind_rljob()
    rayjob = render_rayjob(doc["metadata"]["name"], "kuberl-e2e", UID, RLJobSpec.model_validate(doc["spec"]))
    assert kuberay_checks(rayjob) == []
    if (kuberay_crd_dir() / "ray.io_rayjobs.yaml").is_file() or in_ci():
        assert rayjob_schema_errors(rayjob) == []
    cluster = rayjob["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == "kuberl/trainer:dev" and container["imagePullPolicy"] == "Never"
        assert pod["serviceAccountName"] == "kuberl-trainer"
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
        assert any(m["mountPath"] == "/data/digits" for m in container["volumeMounts"])


def test_the_data_fits_in_a_configmap() -> None:
    size = sum(p.stat().st_size for p in (REPO_ROOT / "examples" / "data").glob("*.parquet"))
    assert size * 4 / 3 < 900 * 1024, "examples/data no longer fits a ConfigMap (1 MiB): mount it another way"


def test_kubectl_applies_the_patch_the_same_way(kube_tools: Tools) -> None:
    require_tools(kube_tools, ["kubectl"])
    result = subprocess.run(
        [
            str(kube_tools.path("kubectl")),
            "patch",
            "--local",
            "-f",
            str(EXAMPLE),
            "--type",
            "merge",
            "--patch-file",
            str(PATCH),
            "-o",
            "yaml",
        ],
        capture_output=True,
        text=True,
        env={"KUBECONFIG": "/nonexistent", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout) == kind_rljob()


def test_the_docs_name_every_pinned_version() -> None:
    pins = dict(re.findall(r"^(\w+)=\$\{\w+:-(.+)\}$", (KIND_DIR / "versions.env").read_text(), re.MULTILINE))
    assert set(pins) == {"KIND_VERSION", "KIND_NODE_IMAGE", "KUBERAY_CHART_VERSION", "KUBERAY_HELM_REPO"}
    docs = DOCS.read_text()
    missing = {name: value for name, value in pins.items() if value not in docs}
    assert not missing, f"docs/e2e.md does not mention {missing}"


def run_steps() -> list[str]:
    return re.findall(r"^step (\w+)$", (KIND_DIR / "run.sh").read_text(), re.MULTILINE)


def test_kuberay_s_namespace_is_the_one_the_rljob_s_network_policy_admits() -> None:
    # the chart's default (kuberay-system) differs from the suite's: without the flag KubeRay could not poll the job
    text = (KIND_DIR / "run.sh").read_text()
    assert script_setting("KUBERAY_NS") == "ray-system"
    assert '--set security.kuberayNamespace="$KUBERAY_NS"' in text


def test_isolation_is_checked_while_the_job_runs_with_the_operator_s_names() -> None:
    steps = run_steps()
    assert steps.index("apply_job") < steps.index("check_isolation") < steps.index("wait_for_success")
    text = (KIND_DIR / "run.sh").read_text()
    body = text[text.index("check_isolation() {") :]
    body = body[: body.index("\n}\n")]
    # the names the operator renders and KubeRay's token Secret (named after the Ray cluster) and key
    assert """get secret "$cluster" """ in body and f"{{.data.{TOKEN_SECRET_KEY}}}" in body
    assert """cluster=$(jp rayjob "$JOB" '{.status.rayClusterName}')""" in body
    assert f'"{RLJOB_LABEL}=$JOB"' in body
    probe = text[text.index("ray_probe() {") :]
    assert f"--env={ENV_RAY_AUTH_MODE}={RAY_AUTH_MODE_TOKEN} --env={ENV_RAY_AUTH_TOKEN}=" in probe
    # three probes: allowed with the token (the control), refused without it, refused from another namespace
    probes = re.findall(r'ray_probe "\$(\w+)" "([^"]*)" "([^"]*)" job (\w+)', body)
    assert probes == [
        ("TEST_NS", f"{RLJOB_LABEL}=$JOB", "$token", "list"),
        ("TEST_NS", f"{RLJOB_LABEL}=$JOB", "", "submit"),
        ("OUTSIDER_NS", "", "$token", "submit"),
    ]
    assert script_setting("OUTSIDER_NS") not in (script_setting("TEST_NS"), script_setting("KUBERAY_NS"))
