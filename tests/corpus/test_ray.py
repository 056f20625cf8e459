"""The corpus tests that start Ray, run inside a private network namespace.

Ray binds network ports; inside `unshare --net` (a namespace of its own, loopback only) it can
reach nothing and nothing can reach it. The cases live in ray_cases.py; this module runs them
once, in one pytest process inside the namespace (one two-node cluster for most of them), and
reports each case under its own name here.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from ..private_network import private_network

HERE = Path(__file__).resolve().parent
CASES = HERE / "ray_cases.py"
REPO = HERE.parent.parent
# The Ray cases take 2-4 minutes on 2 busy cores; a hang must not hold the suite for ever.
INNER_TIMEOUT = 900


def _cases() -> list[tuple[str, bool]]:
    """(name, slow) of every test function of ray_cases.py, read without importing Ray."""
    tree = ast.parse(CASES.read_text(encoding="utf-8"))
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            slow = any("slow" in ast.unparse(d) for d in node.decorator_list)
            found.append((node.name, slow))
    return found


@pytest.fixture(scope="session")
def ray_outcomes(request, tmp_path_factory) -> dict[str, tuple[str, str]]:
    """Run the selected cases of ray_cases.py in a private network namespace, once."""
    pytest.importorskip("ray", reason="the Ray tests need the [ray] extra")
    selected = sorted(
        {item.callspec.params["case"] for item in request.session.items if _is_ours(item)}
    )
    report = tmp_path_factory.mktemp("ray") / "junit.xml"
    inner = [
        sys.executable,
        "-m",
        "pytest",
        str(CASES),
        "-p",
        "no:cacheprovider",
        "-q",
        "-m",
        "slow or not slow",
        "-k",
        " or ".join(selected),
        f"--junitxml={report}",
        f"--basetemp={tmp_path_factory.mktemp('inner')}",
        "-o",
        "faulthandler_timeout=300",
    ]
    command = [*private_network(), *inner]
    env = {
        **os.environ,
        "SPACY_ELMO_TEST_NETNS": "1",  # ray_cases.py runs only here
        "RAY_AUTH_MODE": "disabled",  # the second `ray start` needs no token
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    inner = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = inner.communicate(timeout=INNER_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(inner.pid, signal.SIGKILL)  # the namespace's processes with it
        output, _ = inner.communicate()
        output += f"\nthe Ray cases ran past {INNER_TIMEOUT} s and were killed"
    outcomes: dict[str, tuple[str, str]] = {}
    if report.exists():
        for case in ElementTree.parse(report).iter("testcase"):
            name = case.get("name").split("[")[0]
            failure = case.find("failure")
            failure = case.find("error") if failure is None else failure
            skipped = case.find("skipped")
            if failure is not None:
                outcomes[name] = ("failed", failure.text or failure.get("message", ""))
            elif skipped is not None:
                outcomes[name] = ("skipped", skipped.get("message", ""))
            else:
                outcomes[name] = ("passed", "")
    outcomes["__output__"] = ("", output[-12000:])
    return outcomes


def _is_ours(item) -> bool:
    return item.module is sys.modules[__name__] and hasattr(item, "callspec")


@pytest.mark.parametrize(
    "case",
    [pytest.param(name, marks=[pytest.mark.slow] if slow else []) for name, slow in _cases()],
)
def test_ray(case: str, ray_outcomes) -> None:
    outcome, text = ray_outcomes.get(case, ("missing", ray_outcomes["__output__"][1]))
    if outcome == "skipped":
        pytest.skip(text)
    assert outcome == "passed", f"{case} {outcome} in the network namespace:\n{text}"
