"""Durable Parquet files: the one writer every table uses, and fsync.

A file is written under a temporary name, fsynced, renamed into place and its directory fsynced
(`sing.warehouse.delta.publish`), so a file that the table log names is whole on disk, even after a
power loss. Temporaries of writers killed mid-write are hidden (a leading dot) and deleted by
maintenance.

A warehouse may instead live in an S3-compatible object store (`s3://bucket/prefix`). There a
completed PUT is durable and whole, so nothing is fsynced or renamed: a file is written to a
local spool, then uploaded under its final name. Endpoint and credentials come from the standard
`AWS_*` variables, which delta-rs and pyarrow both read (docs/deploy.md).
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import pyarrow.dataset as ds

ROW_GROUP_ROWS = 131_072  # small enough for ts zone maps to prune a job's window inside a day
PARALLEL_WRITE_ROWS = 1_000_000  # a batch this big is written as parallel files
WRITER_THREADS = min(2, os.cpu_count() or 1)
SCHEMES = ("s3://",)

# A local directory, or an object-store URI (`s3://bucket/prefix/...`) as a string.
Location = Path | str


def write_parquet(table: pa.Table, path: Path) -> None:
    """Dictionary encoding only for text columns (on floats and timestamps it costs half the
    write time and saves nothing), zstd level 1."""
    text = [f.name for f in table.schema if pa.types.is_string(f.type)]
    pq.write_table(
        table,
        path,
        compression="zstd",
        compression_level=1,
        use_dictionary=text,
        row_group_size=ROW_GROUP_ROWS,
    )


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes renames in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporaries(directory: Path, suffix: str, older_than_s: float) -> int:
    """Delete hidden temporary files (`.*<suffix>`) under `directory` left by killed writers."""
    removed = 0
    if not directory.is_dir():
        return 0
    cutoff = time.time() - older_than_s
    for p in directory.rglob(f".*{suffix}"):
        try:
            stale = p.stat().st_mtime < cutoff
        except FileNotFoundError:  # a writer renamed it into place meanwhile
            continue
        if stale:
            p.unlink(missing_ok=True)
            removed += 1
    return removed


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold off Ctrl-C (SIGINT, and SIGTERM) while a few steps that belong together run, so an
    interrupt comes after all of them, never between two (a commit and its record).

    The handlers are swapped rather than the signals masked: a mask holds for one thread only,
    and a signal sent to the process reaches any thread that does not mask it (delta-rs and
    Arrow run their own), whose C handler then has Python raise in the main thread anyway.
    Python runs signal handlers in the main thread only, so elsewhere this is a no-op and the
    steps just run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(caught[0])  # now, to the handler that was there before


# ---- object storage ----------------------------------------------------------------------------


def is_uri(location: str | Path) -> bool:
    """True for an object-store location (`s3://...`); a `Path` is always local."""
    return isinstance(location, str) and location.startswith(SCHEMES)


def join(location: Location, *parts: str) -> Location:
    if isinstance(location, Path):
        return location.joinpath(*parts)
    return "/".join([location.rstrip("/"), *parts])


def storage_options() -> dict[str, str]:
    """What sing adds to delta-rs's own reading of the `AWS_*` variables: commits by
    conditional put (`If-None-Match: *`), so two writers can never both write one log version;
    never `AWS_S3_ALLOW_UNSAFE_RENAME`. A store that ignores the condition is refused at
    opening (`sing.warehouse.store`)."""
    return {"conditional_put": "etag"}


def object_store() -> pafs.S3FileSystem:
    """pyarrow's S3 client, for the data files: endpoint and region from the `AWS_*` variables
    as delta-rs reads them now (pyarrow reads the credentials itself)."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return _object_store(os.environ.get("AWS_ENDPOINT_URL", ""), region)


@cache
def _object_store(endpoint: str, region: str) -> pafs.S3FileSystem:
    """One client per endpoint and region: a client made under other variables is never
    handed out after they changed (delta-rs, beside it, reads them at each call)."""
    scheme, _, host = endpoint.rpartition("://")
    return pafs.S3FileSystem(
        endpoint_override=host or None,
        scheme=scheme or "https",
        region=region,
        allow_bucket_creation=False,
    )


def key(uri: str) -> str:
    """`bucket/key` as pyarrow's S3 client names an object."""
    return uri.split("://", 1)[1]


def spool_path() -> Path:
    """A hidden local temporary for a file bound for object storage."""
    spool = Path(tempfile.gettempdir()) / "sing-spool"
    spool.mkdir(exist_ok=True)
    return spool / f".part-{os.urandom(16).hex()}.tmp"


def upload(local: Path, uri: str) -> None:
    """One object, whole or not at all: S3 shows an object only once its upload completed."""
    pafs.copy_files(str(local), key(uri), destination_filesystem=object_store())


def read_text(location: Location) -> str | None:
    """The file's text, or None where there is none."""
    if isinstance(location, Path):
        try:
            return location.read_text()
        except FileNotFoundError:
            return None
    try:
        with object_store().open_input_stream(key(location)) as stream:
            return stream.read().decode()
    except FileNotFoundError:
        return None


def write_text(location: Location, text: str) -> None:
    """Replace a small file whole: by rename here, by one PUT in object storage."""
    if isinstance(location, Path):
        tmp = location.with_name(f".{location.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, location)
        return
    with object_store().open_output_stream(key(location)) as stream:
        stream.write(text.encode())


def link(source: Location, target: Location) -> None:
    """A second durable name for a finished file: a hard link here, a server-side copy in
    object storage (objects are immutable, so the copy is the same file)."""
    if isinstance(source, Path) and isinstance(target, Path):
        if not target.exists():
            os.link(source, target)
        fsync_path(target.parent)
        return
    object_store().copy_file(key(str(source)), key(str(target)))


def exists(location: Location) -> bool:
    if isinstance(location, Path):
        return location.exists()
    return object_store().get_file_info(key(location)).type != pafs.FileType.NotFound


def parquet_dataset(uris: list[str], schema: pa.Schema | None, day_base: str | None) -> ds.Dataset:
    """Object-store Parquet files as one Arrow dataset, which DuckDB scans lazily with
    projection and filter pushdown (its own S3 reader, httpfs, is an extension downloaded at
    run time, which a site may not allow). `schema`: the columns wanted, missing ones NULL (else
    the first file's); `day_base`: the table whose `day=` directories are the hive partition.

    Strings are read as Arrow's view types: delta-rs's merges wrote them so (the record tables'
    upserts before sing wrote its own; a warehouse keeps such files until compaction rewrites
    them), and Arrow cannot filter a dataset of both under the plain type
    (`equal(string, string_view)`), but it casts plain files to the view type.

    `pyarrow.dataset` is imported here, not at the top: 9 MB resident (more where pandas is not
    yet loaded, which it imports) that a collector on local disk never needs."""
    import pyarrow.dataset as ds

    partitioning = (
        ds.partitioning(pa.schema([("day", pa.date32())]), flavor="hive") if day_base else None
    )

    def dataset(schema: pa.Schema | None) -> ds.Dataset:
        return ds.dataset(
            [key(u) for u in uris],
            schema=schema,
            format="parquet",
            filesystem=object_store(),
            partitioning=partitioning,
            partition_base_dir=key(day_base) if day_base else None,
        )

    return dataset(with_string_views(schema or dataset(None).schema))


def with_string_views(schema: pa.Schema) -> pa.Schema:
    """`schema` with every string and binary type, nested ones too, as its view type."""
    return pa.schema([f.with_type(_view_type(f.type)) for f in schema], schema.metadata)


def _view_type(dtype: pa.DataType) -> pa.DataType:
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return pa.string_view()
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return pa.binary_view()
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return pa.list_(dtype.value_field.with_type(_view_type(dtype.value_type)))
    if pa.types.is_struct(dtype):
        return pa.struct([f.with_type(_view_type(f.type)) for f in dtype])
    return dtype
