"""Where a test run's time went, from its JUnit file: seconds per part and the slowest modules.

`scripts/test.sh` prints this after pytest, so the tail of CI's output (all that CI shows) carries the figures that
docs/testing.md's "What CI runs" is kept from. Usage: `python scripts/ci_times.py runs/ci/pytest.xml`.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

SLOWEST_MODULES = 12


def module_seconds(junit: Path) -> dict[str, float]:
    """Seconds per test module (setup, call and teardown together, as JUnit counts a test case)."""
    seconds: defaultdict[str, float] = defaultdict(float)
    for case in ET.parse(junit).iter("testcase"):
        seconds[case.get("classname") or "?"] += float(case.get("time") or 0.0)
    return dict(seconds)


def slowest(seconds: dict[str, float]) -> list[tuple[str, float]]:
    """(name, seconds), largest first."""
    return sorted(seconds.items(), key=lambda item: -item[1])


def part_of(module: str) -> str:
    """The module's first two folders: `e2e.operator.test_burst` → `e2e/operator`, `e2e.test_e2e` → `e2e`."""
    folders = module.split(".")[:-1]
    return "/".join(folders[:2]) or module


def report(seconds: dict[str, float]) -> str:
    parts: defaultdict[str, float] = defaultdict(float)
    for module, value in seconds.items():
        parts[part_of(module)] += value
    lines = [f"test time by part ({sum(seconds.values()):.0f} s in all):"]
    lines += [f"  {value:7.0f} s  {part}" for part, value in slowest(parts)]
    lines.append(f"slowest {SLOWEST_MODULES} modules:")
    lines += [f"  {value:7.0f} s  {module}" for module, value in slowest(seconds)[:SLOWEST_MODULES]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/ci_times.py JUNIT_XML", file=sys.stderr)
        return 2
    junit = Path(argv[0])
    if not junit.is_file():
        print(f"error: {junit}: no JUnit file (did pytest run with --junitxml?)", file=sys.stderr)
        return 2
    print(report(module_seconds(junit)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
