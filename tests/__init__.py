"""keel's test suite. The repository's paths every test module may import (conftest.py holds the fixtures)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONTRACTS = REPO / "usecases" / "flights" / "contracts"
