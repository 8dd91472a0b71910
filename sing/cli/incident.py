"""`sing incident open|list|note|close`: incidents opened by hand, and every incident's state."""

from __future__ import annotations

import argparse

from sing.config import Config
from sing.health.incidents import (
    CLASSES,
    check_known_node,
    close_incident,
    list_incidents,
    note_incident,
    open_incident,
    user_actor,
)
from sing.tables import Column, print_json, render
from sing.times import time_option
from sing.warehouse.store import Warehouse


def register(subparsers: argparse._SubParsersAction) -> None:
    incident = subparsers.add_parser("incident")
    sub = incident.add_subparsers(dest="incident_command", metavar="ACTION", required=True)
    open_p = sub.add_parser("open", help="open an incident on a node")
    open_p.add_argument("node")
    open_p.add_argument("--class", dest="klass", required=True, choices=CLASSES)
    open_p.add_argument("--device", help="the GPU index or port (mlx5_0/1); default: whole node")
    open_p.add_argument("--note", required=True, help="what happened")
    open_p.set_defaults(func=cmd_open)
    list_p = sub.add_parser("list", help="incidents, newest first")
    list_p.add_argument("--open", action="store_true", help="only those still open")
    list_p.add_argument(
        "--since", type=time_option, help="those open from this time (ISO 8601, UTC) or '7d' ago"
    )
    list_p.add_argument("--json", action="store_true", help="machine-readable output")
    list_p.set_defaults(func=cmd_list)
    note_p = sub.add_parser("note", help="add a note to an incident")
    note_p.add_argument("incident_id", metavar="ID")
    note_p.add_argument("text")
    note_p.set_defaults(func=cmd_note)
    close_p = sub.add_parser("close", help="close an incident, saying how it ended")
    close_p.add_argument("incident_id", metavar="ID")
    close_p.add_argument("--note", required=True, help="how it ended (the resolution)")
    close_p.set_defaults(func=cmd_close)


def cmd_open(args: argparse.Namespace, config: Config) -> int:
    warehouse = _warehouse(args, config)
    warehouse.require_writable()  # an admin may log the first incident before any round
    check_known_node(warehouse, config.site.cluster, args.node)
    incident_id = open_incident(
        warehouse,
        cluster=config.site.cluster,
        node=args.node,
        klass=args.klass,
        device=args.device,
        note=args.note,
        actor=user_actor(),
    )
    print(incident_id)
    return 0


def cmd_list(args: argparse.Namespace, config: Config) -> int:
    rows = list_incidents(_warehouse(args, config), open_only=args.open, since=args.since)
    if args.json:
        print_json(rows)
    elif not rows:
        print("no incidents" + (" open" if args.open else ""))
    else:
        print(render(rows, LIST_TABLE))
    return 0


def cmd_note(args: argparse.Namespace, config: Config) -> int:
    note_incident(_warehouse(args, config), args.incident_id, args.text, actor=user_actor())
    return 0


def cmd_close(args: argparse.Namespace, config: Config) -> int:
    close_incident(_warehouse(args, config), args.incident_id, args.note, actor=user_actor())
    return 0


LIST_TABLE = (
    Column("incident_id", "id"),
    Column("cluster", "cluster"),
    Column("node", "node"),
    Column("device", "device", missing=""),
    Column("class", "class"),
    Column("source", "source"),
    Column("opened_at", "opened (UTC)"),
    Column("opened_by", "opened by"),
    Column("closed_at", "closed (UTC)", missing="open"),
    Column("jobs", "jobs running", missing="", width=24),
    Column("failed_jobs", "jobs failed", missing="", width=24),
    Column("notes", "notes"),
    Column("resolution", "resolution", missing="", width=40),
)


def _warehouse(args: argparse.Namespace, config: Config) -> Warehouse:
    return Warehouse(config.warehouse_dir(args.warehouse))
