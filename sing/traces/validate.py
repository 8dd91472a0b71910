"""`sing trace validate`: check a trace directory against its datapackage.json and the format.

Checks, per resource: the file is there with the recorded size and SHA-256; its columns, types
and units are those of the format version it declares; required fields have no empty values,
enumerations and minimums hold, the primary key is unique; the CSV copy holds the same values as
the Parquet file. A job's failure class must fit its state (a completed job a success, a failed
one a user error or node failure, ...), an incident must not close before it opened. Then the
golden aggregates are recomputed and compared, and an imported release must hold the GPU-time its
source held (`source_gpu_seconds` in datapackage.json, traces.conservation).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sing.traces import aggregates, sql
from sing.traces.conservation import PACKAGE_KEY, gpu_time_problem
from sing.traces.format import FORMAT_VERSION, RESOURCES, Resource
from sing.traces.package import AGGREGATES, file_digest
from sing.traces.read import read_package


def validate(path: str | Path) -> list[str]:
    """All problems found in the trace at `path` (empty when it is valid)."""
    root = Path(path)
    package = read_package(root)
    declared = str(package.get("sing_format", {}).get("version", "?"))
    if declared.split(".")[0] != FORMAT_VERSION.split(".")[0]:
        return [f"format version {declared} is not supported (this tool reads {FORMAT_VERSION})"]
    problems: list[str] = []
    parquet: dict[str, pa.Table] = {}
    for res in package.get("resources", []):
        name = res.get("name", "?")
        base = name.removesuffix("-csv")
        spec = RESOURCES.get(base)
        file = root / str(res.get("path", ""))
        where = f"{file.name}"
        if spec is None:
            problems.append(f"resource {name}: not a table of format {FORMAT_VERSION}")
            continue
        if not file.is_file():
            problems.append(f"{where}: missing")
            continue
        if file.stat().st_size != res.get("bytes"):
            problems.append(
                f"{where}: {file.stat().st_size} bytes, datapackage says {res.get('bytes')}"
            )
        if file_digest(file) != res.get("hash"):
            problems.append(f"{where}: SHA-256 differs from datapackage.json (file changed)")
        fields = res.get("schema", {}).get("fields", [])
        problems += _check_descriptors(where, spec, fields)
        if res.get("format") == "parquet":
            table = pq.read_table(file)
            parquet[base] = table
            problems += _check_table(where, spec, table, fields, res.get("rows"))
        else:
            problems += _check_csv(where, file, fields)
    for base, table in parquet.items():
        csv_copies = [r for r in package["resources"] if r.get("name") == f"{base}-csv"]
        for res in csv_copies:
            problems += _compare_csv(root / res["path"], table)
    if "jobs" not in parquet:
        problems.append("no jobs.parquet resource")
        return problems
    problems += _check_failure_classes(parquet["jobs"])
    if "incidents" in parquet:
        problems += _check_incidents(parquet["incidents"])
    stored_file = root / AGGREGATES
    if not stored_file.is_file():
        return [*problems, f"{AGGREGATES}: missing"]
    stored = json.loads(stored_file.read_text())
    actual = aggregates.compute(parquet["jobs"], parquet.get("job_timeseries"))
    problems += aggregates.differences(stored, actual)
    if package.get(PACKAGE_KEY) is not None:
        lost = gpu_time_problem(float(package[PACKAGE_KEY]), actual["gpu_seconds"])
        problems += [lost] if lost else []
    return problems


def _check_descriptors(where: str, spec: Resource, fields: list[dict]) -> list[str]:
    problems = []
    known = {f.name: f for f in spec.fields}
    for d in fields:
        f = known.get(d.get("name"))
        if f is None:
            problems.append(f"{where}: field {d.get('name')!r} is not in format {FORMAT_VERSION}")
            continue
        if d.get("type") != f.frictionless_type:
            problems.append(
                f"{where}: field {f.name} type {d.get('type')}, format says {f.frictionless_type}"
            )
        if d.get("unit") != f.unit:
            problems.append(
                f"{where}: field {f.name} unit {d.get('unit')!r}, format says {f.unit!r}"
            )
    missing = [
        f.name for f in spec.fields if f.required and f.name not in {d.get("name") for d in fields}
    ]
    if missing:
        problems.append(f"{where}: required field(s) missing: {', '.join(missing)}")
    return problems


def _check_table(
    where: str, spec: Resource, table: pa.Table, fields: list[dict], rows: int | None
) -> list[str]:
    problems = []
    names = [d.get("name") for d in fields]
    if table.column_names != names:
        return [f"{where}: columns {table.column_names} differ from datapackage fields {names}"]
    if rows != table.num_rows:
        problems.append(f"{where}: {table.num_rows} rows, datapackage says {rows}")
    known = {f.name for f in spec.fields}
    for name in (n for n in names if n in known):  # others: _check_descriptors names them
        f = spec.field(name)
        column = table.column(name)
        if column.type != f.type:
            problems.append(f"{where}: column {name} is {column.type}, format says {f.type}")
            continue
        if f.required and column.null_count:
            row = pc.index(pc.is_null(column), True).as_py()
            problems.append(f"{where}: row {row + 1}: required field {name} is empty")
        if f.enum:
            bad = pc.filter(column, pc.invert(pc.is_in(column, pa.array(f.enum))))
            bad = pc.drop_null(bad)
            if len(bad):
                problems.append(
                    f"{where}: field {name} has value {bad[0].as_py()!r} not in {list(f.enum)}"
                )
        if f.minimum is not None and column.null_count < len(column):
            low = pc.min(column).as_py()
            if low < f.minimum:
                problems.append(f"{where}: field {name} has {low}, below its minimum {f.minimum}")
    key = list(spec.primary_key)
    if all(k in names for k in key):
        con = sql.connect()
        con.register("t", table.select(key))
        dupes = con.execute(
            f"SELECT count(*) - count(DISTINCT ({', '.join(key)})) FROM t"
        ).fetchone()[0]
        if dupes:
            problems.append(f"{where}: primary key ({', '.join(key)}) has {dupes} duplicate(s)")
    return problems


# The failure classes each released state allows (sing.traces.format; empty: none).
STATE_FAILURES = {
    "completed": ("success",),
    "failed": ("user_error", "node_failure"),
    "out_of_memory": ("user_error",),
    "node_fail": ("node_failure",),
    "timeout": ("timeout",),
    "preempted": ("preemption",),
    "cancelled": ("cancelled",),
    "running": (),
    "pending": (),
}


def _check_failure_classes(jobs: pa.Table) -> list[str]:
    """Each job's failure class fits its state (a trace of format 1.1 has none to check)."""
    if "failure_class" not in jobs.column_names or "state" not in jobs.column_names:
        return []
    pairs = zip(jobs["state"].to_pylist(), jobs["failure_class"].to_pylist(), strict=True)
    for row, (state, failure) in enumerate(pairs, start=1):
        allowed = STATE_FAILURES.get(state)
        if failure is not None and allowed is not None and failure not in allowed:
            return [f"jobs.parquet: row {row}: failure_class {failure!r} with state {state!r}"]
    return []


def _check_incidents(incidents: pa.Table) -> list[str]:
    closed_early = pc.less(incidents["closed_s"], incidents["opened_s"])
    if pc.any(closed_early).as_py():
        row = pc.index(closed_early, True).as_py()
        return [f"incidents.parquet: row {row + 1}: closed_s is before opened_s"]
    return []


def _check_csv(where: str, file: Path, fields: list[dict]) -> list[str]:
    with open(file, encoding="utf-8") as fh:
        header = fh.readline().rstrip("\r\n").split(",")
    names = [d.get("name") for d in fields]
    if header != names:
        return [f"{where}: header {header} differs from datapackage fields {names}"]
    return []


def _compare_csv(file: Path, table: pa.Table) -> list[str]:
    """The CSV copy must hold the Parquet file's values (arrays compared as JSON text)."""
    con = sql.connect()
    con.register("p", table)
    columns = []
    for field in table.schema:
        q = f'"{field.name}"'
        if pa.types.is_list(field.type):
            columns.append(f"to_json({q})::VARCHAR AS {q}")
        else:
            columns.append(f"{q}::VARCHAR AS {q}")
    try:
        csv = pacsv.read_csv(
            file,
            convert_options=pacsv.ConvertOptions(
                column_types={f.name: pa.string() for f in table.schema},
                strings_can_be_null=True,
            ),
        )
    except pa.ArrowInvalid as err:
        return [f"{file.name}: cannot read as CSV: {err}"]
    if csv.num_rows != table.num_rows:
        return [f"{file.name}: {csv.num_rows} rows, the Parquet file has {table.num_rows}"]
    con.register("c", csv)
    parquet_rows = f"SELECT {', '.join(columns)} FROM p"
    diff = con.execute(
        f"SELECT (SELECT count(*) FROM ({parquet_rows} EXCEPT ALL SELECT * FROM c))"
        f" + (SELECT count(*) FROM (SELECT * FROM c EXCEPT ALL {parquet_rows}))"
    ).fetchone()[0]
    return [f"{file.name}: {diff} row(s) differ from the Parquet file"] if diff else []
