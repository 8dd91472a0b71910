"""`sing warehouse import`: load a CSV or Parquet file into one warehouse table.

CSV is read as text first and every value is checked against its column's type, so a bad value
is reported with file, row and column, and nothing is written unless the whole file is good.

Samples are completed the way the collector writes them, so reports treat imported and scraped
data alike: a missing `cluster` is the warehouse's only cluster; counter deltas a file lacks
(`energy_delta_j`, `tx/rx_delta_bytes`) are computed from the counters (a counter that went
down restarted from 0); and a sample without a job id gets the job that held the GPU then,
from `job_gpus`, by the collector's rule (docs/collector.md) - or the import is refused with
what to do, never written unattributed without a record saying no job held the GPU.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from sing.errors import UserError
from sing.jobids import job_order_sql
from sing.schema import table
from sing.warehouse import files
from sing.warehouse.files import Location, uninterrupted
from sing.warehouse.store import Warehouse, conform

# DuckDB types that check CSV text for each Arrow type of the schema.
_DUCKDB_TYPES = {
    pa.string(): "VARCHAR",
    pa.int16(): "SMALLINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "REAL",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
}


# Under the warehouse root: one record per imported file content and table, by sha256.
IMPORTS_DIR = ".imports"


@dataclass(frozen=True)
class Imported:
    rows: int  # rows written
    attributed: int = 0  # samples whose job id came from job_gpus


def import_file(wh: Warehouse, table_name: str, path: Path) -> Imported:
    """Load `path` into `table_name`. Raises UserError on bad input, writing nothing."""
    spec = table(table_name)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    if path.suffix.lower() == ".parquet":
        try:
            data = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as err:
            raise UserError(f"{path}: not a readable Parquet file: {err}") from err
    else:
        data = _read_csv(path, spec)
    try:
        batch = conform(spec, data)
        attributed = 0
        if table_name in _COUNTERS:
            wh.require_writable()  # its completion reads the warehouse, so it must be there
            batch, attributed = _complete_samples(wh, table_name, batch, set(data.column_names))
    except UserError as err:
        raise UserError(f"{path}: {err}") from err
    record = _import_record(wh, table_name, path)
    with uninterrupted():  # the rows and the record that they are in, or neither
        rows = wh.append(table_name, batch)
        if isinstance(record, Path):
            record.parent.mkdir(parents=True, exist_ok=True)
        files.write_text(
            record,
            json.dumps({"file": str(path), "rows": rows, "at": datetime.now(UTC).isoformat()}),
        )
    return Imported(rows, attributed)


def _import_record(wh: Warehouse, table_name: str, path: Path) -> Location:
    """Where the import of this file's content into this table is recorded, refusing a second
    import of it: appended again, every sample would count twice."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    record = files.join(wh.root, IMPORTS_DIR, table_name, f"{digest.hexdigest()}.json")
    if (text := files.read_text(record)) is not None:
        earlier = json.loads(text)
        raise UserError(
            f"{path}: this content was already imported into {table_name} on {earlier['at'][:19]} "
            f"({earlier['rows']} rows, from {earlier['file']}); nothing written "
            f"(remove {record} to import it again)"
        )
    return record


# Per sample table: the columns naming one counter series, and (counter, its delta) pairs.
_COUNTERS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    "gpu_samples": (("cluster", "node", "gpu_index"), (("energy_j", "energy_delta_j"),)),
    "rdma_samples": (
        ("cluster", "node", "device", "port"),
        (("tx_bytes", "tx_delta_bytes"), ("rx_bytes", "rx_delta_bytes")),
    ),
}

# The job of a sample without one, from the allocations at its time: for a GPU, the job holding
# it; for an RDMA port, the job holding most of the node's GPUs (ties: lowest numeric job id).
_HELD = """
    JOIN job_gpus a ON a.cluster = s.cluster AND a.node = s.node
     AND a.start_time <= s.ts AND s.ts < coalesce(a.end_time, 'infinity'::TIMESTAMPTZ)
"""
_ATTRIBUTE = {
    "gpu_samples": f"""
        SELECT s.__row, a.job_id FROM incoming s {_HELD} AND a.gpu_index = s.gpu_index
        WHERE s.job_id IS NULL
        QUALIFY row_number() OVER (
            PARTITION BY s.__row ORDER BY {job_order_sql("a.job_id")}) = 1
    """,
    "rdma_samples": f"""
        SELECT s.__row, a.job_id FROM incoming s {_HELD}
        WHERE s.job_id IS NULL
        GROUP BY s.__row, a.job_id
        QUALIFY row_number() OVER (
            PARTITION BY s.__row
            ORDER BY count(*) DESC, {job_order_sql("a.job_id")}) = 1
    """,
}


def _complete_samples(
    wh: Warehouse, name: str, batch: pa.Table, given: set[str]
) -> tuple[pa.Table, int]:
    """The batch with cluster, counter deltas and job ids filled in; (batch, rows attributed)."""
    spec = table(name)
    series, counters = _COUNTERS[name]
    con = wh.connect()
    con.register("batch", batch.append_column("__row", pa.array(range(batch.num_rows))))
    con.execute("CREATE TEMP TABLE incoming AS FROM batch")  # a table, to fill in place
    con.execute(f"UPDATE incoming SET cluster = {_only_cluster(con)} WHERE cluster IS NULL")
    keys = ", ".join(series)
    for counter, delta in counters:
        if delta in given:
            continue
        # The previous sample of the same series; an unknown (NULL) counter or one without a
        # previous sample has no delta, and a counter that went down restarted from 0.
        con.execute(
            f"""
            UPDATE incoming t SET {delta} = d.delta FROM (
                SELECT __row, CASE WHEN prev IS NULL THEN NULL
                                   WHEN {counter} >= prev THEN {counter} - prev
                                   ELSE {counter} END AS delta
                FROM (SELECT __row, {counter},
                             lag({counter}) OVER (PARTITION BY {keys} ORDER BY ts) AS prev
                      FROM incoming)
            ) d WHERE t.__row = d.__row
            """
        )
    _check_attributable(con)
    attributed = con.execute(
        f"""
        UPDATE incoming t SET job_id = h.job_id FROM ({_ATTRIBUTE[name]}) h
        WHERE t.__row = h.__row
        """
    ).fetchone()[0]
    columns = ", ".join(f'"{f.name}"' for f in spec.schema)
    done = con.sql(f"SELECT {columns} FROM incoming ORDER BY __row").to_arrow_table()
    return conform(spec, done), int(attributed)


def _only_cluster(con: duckdb.DuckDBPyConnection) -> str:
    """SQL for the cluster of rows that name none: the warehouse's only one; refuses when the
    warehouse has several and the file leaves its rows' cluster open."""
    clusters = con.execute(
        "SELECT DISTINCT cluster FROM (SELECT cluster FROM jobs UNION SELECT cluster FROM job_gpus)"
        " WHERE cluster IS NOT NULL ORDER BY 1"
    ).fetchall()
    unnamed = con.execute("SELECT count(*) FROM incoming WHERE cluster IS NULL").fetchone()[0]
    if len(clusters) > 1 and unnamed:
        raise UserError(
            f"{unnamed} row(s) name no cluster and the warehouse holds several "
            f"({', '.join(c[0] for c in clusters)}): add a cluster column"
        )
    return "NULL" if not clusters else "'" + clusters[0][0].replace("'", "''") + "'"


def _check_attributable(con: duckdb.DuckDBPyConnection) -> None:
    """Samples without a job id need allocation records for their time, or they would be
    written as if no job held the GPUs."""
    missing, first, last = con.execute(
        "SELECT count(*), min(ts), max(ts) FROM incoming WHERE job_id IS NULL"
    ).fetchone()
    if not missing:
        return
    covered = con.execute(
        """
        SELECT count(*) FROM job_gpus
        WHERE cluster IN (SELECT cluster FROM incoming WHERE job_id IS NULL)
          AND start_time <= ? AND coalesce(end_time, 'infinity'::TIMESTAMPTZ) > ?
        """,
        [last, first],
    ).fetchone()[0]
    if not covered:
        raise UserError(
            f"{missing} row(s) have no job_id and no job_gpus record covers their time "
            f"({first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC), so sing cannot "
            "tell which job held the GPUs: import jobs/job_gpus first or add a job_id column"
        )


def _read_csv(path: Path, spec) -> pa.Table:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    try:
        con.execute(
            "CREATE TABLE raw AS SELECT row_number() OVER () AS __row, * "
            "FROM read_csv(?, all_varchar = true, header = true)",
            [str(path)],
        )
    except duckdb.Error as err:
        raise UserError(f"{path}: cannot read as CSV: {err}") from err
    columns = [c for c in con.sql("SELECT * FROM raw LIMIT 0").columns]
    unknown = [c for c in columns[1:] if c not in spec.schema.names]
    if unknown:
        raise UserError(
            f"{path}: unknown column(s) {', '.join(unknown)} for table {spec.name}; "
            f"columns are {', '.join(spec.schema.names)}"
        )
    selects = []
    for field in spec.schema:
        if field.name not in columns:
            continue
        expr, sql_type = _typed(field)
        bad = con.execute(
            f'SELECT __row, "{field.name}" FROM raw WHERE "{field.name}" IS NOT NULL '
            f"AND trim(\"{field.name}\") <> '' AND {expr} IS NULL ORDER BY __row LIMIT 1"
        ).fetchone()
        if bad:
            raise UserError(
                f"{path}: row {bad[0]} (line {bad[0] + 1}), column {field.name}: "
                f"{bad[1]!r} is not a valid {sql_type}"
            )
        selects.append(
            f'CASE WHEN trim("{field.name}") = \'\' THEN NULL ELSE {expr} END AS "{field.name}"'
        )
    return con.sql(f"SELECT {', '.join(selects)} FROM raw ORDER BY __row").to_arrow_table()


def _typed(field: pa.Field) -> tuple[str, str]:
    """SQL converting the text column to the field's type (NULL where it cannot)."""
    col = f'"{field.name}"'
    if pa.types.is_timestamp(field.type):
        return f"TRY_CAST({col} AS TIMESTAMPTZ)", "ISO 8601 time such as 2026-01-05T10:00:00Z"
    if pa.types.is_list(field.type):
        return (
            f"string_split(regexp_replace(trim({col}), '\\s*,\\s*', ',', 'g'), ',')",
            "comma-separated list",
        )
    sql_type = _DUCKDB_TYPES[field.type]
    if pa.types.is_integer(field.type):  # TRY_CAST('1.5' AS INTEGER) would round to 2
        return (
            f"CASE WHEN regexp_full_match(trim({col}), '[+-]?[0-9]+') "
            f"THEN TRY_CAST({col} AS {sql_type}) END",
            sql_type,
        )
    return f"TRY_CAST({col} AS {sql_type})", sql_type
