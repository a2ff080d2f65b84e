"""``keel k8s``: the Kubernetes deployment profile."""

from __future__ import annotations

import argparse
from pathlib import Path

from keel.cli.common import EXIT_OK


def register(sub) -> None:
    k8s = sub.add_parser("k8s", help="the Kubernetes deployment profile: render manifests and Helm values")
    ksub = k8s.add_subparsers(dest="k8s_command", required=True, metavar="COMMAND")
    render = ksub.add_parser("render", help="write dagster.yaml, helm-values.yaml and model-runtime.yaml")
    render.add_argument("--profile", type=Path, help="default: keel/deploy/profile.yaml")
    render.add_argument("--out", required=True, type=Path)
    render.set_defaults(func=_k8s_render)


def _k8s_render(args: argparse.Namespace) -> int:
    from keel.deploy.k8s import PROFILE, load_profile, render

    for path in render(load_profile(args.profile or PROFILE), args.out):
        print(f"wrote {path}")
    return EXIT_OK
