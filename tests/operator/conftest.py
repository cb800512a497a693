"""The operator's pure tests import the KubeRay schema helpers from `e2e.operator`: make the repo root importable."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
