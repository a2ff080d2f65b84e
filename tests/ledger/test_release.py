"""Release manifests: four hashes and a release id that changes exactly when a part does."""

from keel.release import changed_parts, infra_snapshot, release_manifest

BASE = {
    "data": {"flight_features": {"2013-01": "dv1"}, "contracts": {"flights": "c1"}},
    "model": {"sha256": "m1", "training_code": "t1", "params": {"seed": 2013}},
    "infra": {"python": "3.11.7", "packages": {"lightgbm": "4.7.0"}},
    "policy": {"routing": None},
}


def test_release_id_is_derived_from_the_four_hashes():
    a = release_manifest(**BASE)
    assert a == release_manifest(**BASE) and a["release_id"].startswith("rel-")
    assert all(len(a[p]["hash"]) == 64 for p in ("data", "model", "infra", "policy"))
    for part, edit in (
        ("data", {"contracts": {"flights": "c2"}}),
        ("model", {"params": {"seed": 7}}),
        ("infra", {"python": "3.12"}),
        ("policy", {"routing": 2}),
    ):
        b = release_manifest(**(BASE | {part: BASE[part] | edit}))
        assert b["release_id"] != a["release_id"] and changed_parts(a, b) == [part]


def test_infra_snapshot_names_the_locked_packages():
    snap = infra_snapshot()
    assert snap["packages"]["dagster"] == "1.13.27" and snap["python"].startswith("3.11")
