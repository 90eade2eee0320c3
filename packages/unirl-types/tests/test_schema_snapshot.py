"""The committed JSON schema matches the code; a schema change needs a schema_version bump."""

import json

from unirl.types.schema import SNAPSHOT, current


def test_schema_snapshot_matches_code():
    snap = json.loads(SNAPSHOT.read_text())
    now = current()
    if snap["schema"] != now["schema"]:
        if snap["schema_version"] == now["schema_version"]:
            raise AssertionError(
                "the Sample schema changed without a version bump: increase SCHEMA_VERSION in "
                "unirl/types/sample.py, then run `python -m unirl.types.schema --write`"
            )
        raise AssertionError("schema snapshot is stale: run `python -m unirl.types.schema --write`")
    assert snap["schema_version"] == now["schema_version"], "run `python -m unirl.types.schema --write`"
