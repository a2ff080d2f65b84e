"""Factories that turn keel specs (contracts, features, ...) into Dagster assets and checks.

They are the only place where keel's pure logic meets Dagster; ``assets/`` calls them for this deployment.
"""
