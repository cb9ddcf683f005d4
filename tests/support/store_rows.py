"""Every row of a store file, in a form two runs' stores compare by: the write's wall clock left out,
a span's attributes as a mapping (their order is not data), each table's rows sorted."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path


def store_rows(workdir: Path) -> dict[str, list[str]]:
    """The rows of the one store database under ``workdir``, by table."""
    databases = sorted(workdir.rglob("*.db")) + sorted(workdir.rglob("*.sqlite*"))
    assert databases, f"no store database under {workdir}"
    rows: dict[str, list[str]] = {}
    with sqlite3.connect(databases[0]) as db:
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
            columns = [c[1] for c in db.execute(f"PRAGMA table_info({table})")]
            found = []
            for row in db.execute(f"SELECT * FROM {table}"):
                record = dict(zip(columns, row))
                record.pop("stored_at", None)  # the wall clock of the write
                if table == "spans" and record.get("attributes") is not None:
                    record["attributes"] = json.loads(record["attributes"])
                found.append(json.dumps(record, sort_keys=True, default=repr))
            rows[table] = sorted(found)
    return rows
