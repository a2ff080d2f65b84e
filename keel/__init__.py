"""keel: an AI-engineering platform written as code on Dagster assets.

This package is the platform library. Everything here is importable and testable without a running Dagster:
the Dagster wiring lives in the top-level ``assets/``, ``resources/`` and ``sensors/`` packages.
"""

__version__ = "0.1.0"
