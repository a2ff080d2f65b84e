"""The state layout under ``$KEEL_HOME``: every path keel reads or writes there comes from ``KeelHome``.

::

    $KEEL_HOME/
      storage/<asset>/<partition>.parquet   assets' values (the Parquet IO manager; ``asset_file``), reports beside them
      registry/                             model registry (text models + metadata)
      ledger.sqlite                         release ledger (hash-chained)      } or a Postgres schema:
      policies.sqlite                       policy store (hash-chained)        } $KEEL_CONTROL_PLANE
      registry/registry.sqlite              model metadata and aliases         } (keel.sqldb)
      keys/chain.key                        the chain checkpoints' HMAC key (0600), unless $KEEL_CHAIN_KEY
      online/<use case>.sqlite              online feature store, one per use case
      experiments/<id>/spec.yaml            experiments started with ``keel experiment start``
      serving/                              the model runtime's (python -m gpu_runtime.serve)
        model_repository/                   Triton's model repository
        triton/                             Triton's work directory (log, pid, maintenance ``hold``)
        routing/<model>.json                what the gateway routes each model to
        endpoints.json                      where the running runtime listens
        exposures/exposures-YYYYMMDD.jsonl  the exposure log (keel.exposure_log)
        compute/compute-YYYYMMDD.jsonl      Triton's compute statistics, sampled by the gateway (keel.metering)

``KeelHome.from_env()`` reads ``$KEEL_HOME`` at call time (else ``.keel`` in the repository), so tests and
commands that set it after import see their own home.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from keel.names import validate_name
from keel.sqldb import Location, control_plane

REPO_ROOT = Path(__file__).resolve().parent.parent

# A test home carries this file, in itself or in a folder above it (a test session marks its temporary root, so every
# home a test makes under it is one; scripts/test marks the home it creates). Only a test home may set the failing
# controls' fault switches (keel/faults.py), and only a test home's processes are a test run's to stop (tests/
# leftovers.py): a platform on a home that a test run was merely handed is never touched.
TEST_HOME_MARKER = ".keel-test-home"


def mark_test_home(root: str | Path) -> Path:
    """Mark ``root`` (created if need be) and every home under it as a test run's own; returns the marker."""
    marker = Path(root) / TEST_HOME_MARKER
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("made by a test run: its homes' processes are the run's, fault switches are allowed here\n")
    return marker


def is_test_home(root: str | Path) -> bool:
    """Whether ``root`` is a test home: it or a folder above it holds ``TEST_HOME_MARKER``."""
    path = Path(root).resolve()
    return any((p / TEST_HOME_MARKER).is_file() for p in (path, *path.parents))


@dataclass(frozen=True)
class KeelHome:
    root: Path

    @classmethod
    def from_env(cls) -> KeelHome:
        return cls(Path(os.environ.get("KEEL_HOME") or REPO_ROOT / ".keel").resolve())

    @classmethod
    def of(cls, root: str | Path | None) -> KeelHome:
        """``root`` when given, else the environment's."""
        return cls(Path(root).resolve()) if root else cls.from_env()

    @property
    def is_test_home(self) -> bool:
        """A home a test run made (``is_test_home``)."""
        return is_test_home(self.root)

    # -- the control plane ---------------------------------------------------------------------------------------
    def shown(self, path: Path | Location) -> str:
        """``path`` as the UI and logs show it: ``$KEEL_HOME/...`` inside the home (no machine paths), else as is (a
        Postgres location without its password)."""
        if not isinstance(path, Path):
            return str(path)
        try:
            return f"$KEEL_HOME/{Path(path).resolve().relative_to(self.root).as_posix()}"
        except ValueError:
            return str(path)

    @property
    def clock(self) -> Path:
        """The simulated clock of a live replay (keel.clock.SimClock); absent: the wall clock."""
        return self.root / "clock.json"

    @property
    def clock_ticks(self) -> Path:
        """A stepped replay's newest tick of each deciding sensor (keel.steps.record_tick)."""
        return self.root / "clock_ticks"

    @property
    def incidents(self) -> Location:
        """The incident log (keel.incidents.IncidentLog): ``incidents.sqlite``, or the Postgres schema of
        ``$KEEL_CONTROL_PLANE``."""
        return control_plane(self.root / "incidents.sqlite", "incidents")

    @property
    def landing(self) -> Path:
        """The landing zone of a live replay (keel.data.landing.LandingZone)."""
        return self.root / "landing"

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    @property
    def ledger(self) -> Location:
        """``ledger.sqlite``, or the Postgres schema of ``$KEEL_CONTROL_PLANE`` (keel.sqldb.control_plane)."""
        return control_plane(self.root / "ledger.sqlite", "entries")

    @property
    def policies(self) -> Location:
        """``policies.sqlite``, or the Postgres schema of ``$KEEL_CONTROL_PLANE``."""
        return control_plane(self.root / "policies.sqlite", "commits")

    def online_store_of(self, usecase: str) -> Path:
        """The embedded online store of use case ``usecase`` (a name keel/usecase.py validated)."""
        return self.root / "online" / f"{usecase}.sqlite"

    @property
    def experiments(self) -> Path:
        return self.root / "experiments"

    def experiment(self, exp_id: str) -> Path:
        return self.experiments / validate_name(exp_id, what="experiment id")

    # -- asset storage -------------------------------------------------------------------------------------------
    @property
    def storage(self) -> Path:
        return self.root / "storage"

    def asset_dir(self, asset: str) -> Path:
        return self.storage / validate_name(asset, what="asset name")

    def asset_file(self, asset: str, partition: str | None = None) -> Path:
        """``asset``: its key as the UI writes it (``flights/flight_features``)."""
        return asset_file(self.storage, asset.split("/"), partition)

    def impact_predictor(self, usecase: str) -> Path:
        """The use case's impact predictor (its ``<use case>/impact_predictor`` asset writes it)."""
        return self.storage / validate_name(usecase, what="use case") / "impact_predictor" / "predictor.json"

    # -- the model runtime ---------------------------------------------------------------------------------------
    @property
    def serving(self) -> ServingDir:
        return ServingDir(self.root / "serving")

    def replica(self, name: str | None) -> ServingDir:
        """The serving directory of one model-runtime replica (``$KEEL_REPLICA``): ``replicas/<name>/``, so that
        several gateways and Tritons on one home never write the same file (each its own routing, endpoints,
        exposure and compute logs). None: the single runtime's ``serving/``."""
        if not name:
            return self.serving
        return ServingDir(self.root / "replicas" / validate_name(name, what="replica name"))

    def serving_dirs(self) -> list[ServingDir]:
        """Every runtime of this home: its replicas (``replicas/<name>/``) when it has any, else ``serving/`` — what
        readers of the exposure and compute logs (canaries, metering) and a deployment to all runtimes go through."""
        replicas = sorted(p for p in (self.root / "replicas").glob("*") if p.is_dir())
        return [ServingDir(p) for p in replicas] or [self.serving]

    def exposure_dirs(self) -> list[Path]:
        """The exposure logs of every gateway of this home (one directory each: no file has two writers)."""
        return [d.exposures for d in self.serving_dirs()]


def asset_file(storage: Path, key_path: list[str], partition: str | None = None) -> Path:
    """Where the Parquet IO manager keeps an asset's value: ``<storage>/<key…>.parquet``, or for a partitioned asset
    ``<storage>/<key…>/<partition>.parquet``. Every part is validated (names become paths)."""
    parts = [validate_name(p, what="asset key part") for p in key_path]
    if partition is None:
        return Path(storage).joinpath(*parts[:-1], f"{parts[-1]}.parquet")
    return Path(storage).joinpath(*parts, f"{validate_name(partition, what='partition key')}.parquet")


@dataclass(frozen=True)
class ServingDir:
    """The model runtime's directory (``$KEEL_HOME/serving`` unless a resource names another)."""

    root: Path

    @property
    def model_repository(self) -> Path:
        return self.root / "model_repository"

    @property
    def triton_dir(self) -> Path:
        return self.root / "triton"

    @property
    def routing_dir(self) -> Path:
        """One routing table per served model (``routing/<model>.json``): what the gateway routes that model to."""
        return self.root / "routing"

    def routing_of(self, model: str) -> Path:
        """The routing table of ``model`` (validated: safe as a file name)."""
        return self.routing_dir / f"{validate_name(model, what='model name')}.json"

    @property
    def endpoints(self) -> Path:
        return self.root / "endpoints.json"

    def live_traffic(self, usecase: str) -> Path:
        """The running totals of a live replay's traffic for ``usecase`` (gpu_runtime.replay --live)."""
        return self.live_traffic_dir / f"{validate_name(usecase, what='use case')}.json"

    @property
    def live_traffic_dir(self) -> Path:
        return self.root / "live_traffic"

    @property
    def exposures(self) -> Path:
        return self.root / "exposures"

    @property
    def compute(self) -> Path:
        """Triton's per-version compute statistics as the gateway samples them (keel.metering.compute)."""
        return self.root / "compute"
