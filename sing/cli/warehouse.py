"""`sing warehouse ...`: import files, run read-only SQL, compact and age out data."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import duckdb

from sing.config import Config
from sing.errors import UserError
from sing.schema import TABLES
from sing.tables import print_json, render_query
from sing.warehouse.importer import import_file
from sing.warehouse.store import Warehouse

# Statement types `sing warehouse sql` runs; anything else could write or reach outside.
READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("warehouse")
    sub = parser.add_subparsers(dest="warehouse_command", metavar="ACTION", required=True)

    imp = sub.add_parser("import", help="load a CSV or Parquet file into a table")
    imp.add_argument("table", choices=sorted(TABLES))
    imp.add_argument("file", type=Path)
    imp.set_defaults(func=cmd_import)

    sql = sub.add_parser("sql", help="run a read-only SQL query over the warehouse views")
    sql.add_argument("query")
    sql.add_argument("--json", action="store_true", help='print {"rows": [...], "columns": [...]}')
    sql.set_defaults(func=cmd_sql)

    compact = sub.add_parser("compact", help="merge small files, build rollups, apply retention")
    compact.add_argument("--retention-days", type=int, help="drop raw samples older than this")
    compact.set_defaults(func=cmd_compact)


def open_warehouse(args: argparse.Namespace, config: Config) -> Warehouse:
    return Warehouse(config.warehouse_dir(args.warehouse))


def cmd_import(args: argparse.Namespace, config: Config) -> int:
    imported = import_file(open_warehouse(args, config), args.table, args.file)
    attributed = (
        f" ({imported.attributed} attributed to jobs from job_gpus)" if imported.attributed else ""
    )
    print(f"imported {imported.rows} rows into {args.table}{attributed}")
    return 0


def cmd_sql(args: argparse.Namespace, config: Config) -> int:
    con = open_warehouse(args, config).connect()
    rows, columns = run_read_only(con, args.query)
    if args.json:
        print_json((dict(zip(columns, r, strict=True)) for r in rows), columns=columns)
    else:
        print(render_query(columns, rows))
    return 0


def run_read_only(con: duckdb.DuckDBPyConnection, query: str) -> tuple[list[tuple], list[str]]:
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as err:
        raise UserError(f"SQL does not parse: {err}") from err
    for statement in statements:
        if statement.type.name == "EXPLAIN" and not re.match(
            r"\s*EXPLAIN\s+(ANALYZE\s+)?(SELECT|FROM|WITH)\b", statement.query, re.IGNORECASE
        ):
            raise UserError("only read-only queries are allowed, not EXPLAIN of a non-SELECT")
        if statement.type.name not in READ_ONLY_STATEMENTS:
            raise UserError(f"only read-only queries are allowed, not {statement.type.name}")
    if len(statements) != 1:
        raise UserError("give exactly one SQL statement")
    try:
        cursor = con.execute(query)
    except duckdb.Error as err:
        raise UserError(f"query failed: {err}") from err
    return cursor.fetchall(), [d[0] for d in cursor.description]


def cmd_compact(args: argparse.Namespace, config: Config) -> int:
    wh = open_warehouse(args, config)
    wh.require_existing()  # compacting a mistyped path would create an empty warehouse there
    result = wh.compact()
    print(
        f"merged {result.merged_files} files, rolled up {result.rollup_days} days, "
        f"deleted {result.deleted_files} superseded files"
    )
    if args.retention_days is not None:
        removed = wh.apply_retention(args.retention_days)
        print(f"dropped {len(removed)} raw day directories")
    return 0
