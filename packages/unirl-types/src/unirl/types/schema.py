"""The committed JSON-schema snapshot of Sample: ``python -m unirl.types.schema --write`` refreshes it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from unirl.types.sample import SCHEMA_VERSION, Sample

SNAPSHOT = Path(__file__).with_name("sample.schema.json")


def current() -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "schema": Sample.model_json_schema()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="overwrite the snapshot with the current schema")
    args = ap.parse_args(argv)
    text = json.dumps(current(), indent=1, sort_keys=True) + "\n"
    if args.write:
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(text)
        print(f"wrote {SNAPSHOT}")
    else:
        print(text)


if __name__ == "__main__":
    main()
