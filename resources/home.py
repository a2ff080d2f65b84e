"""The KEEL_HOME state layout as a Dagster resource, for assets and sensors that read files no store owns (the
exposure log, asset reports): ``keel_home.layout()`` is the ``keel.home.KeelHome`` every other resource uses."""

from __future__ import annotations

import dagster as dg

from keel.home import KeelHome


class KeelHomeResource(dg.ConfigurableResource):
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used

    def layout(self) -> KeelHome:
        return KeelHome.of(self.home)
