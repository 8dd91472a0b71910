"""SING's self-contained job profile: one YAML file a user writes once and runs anywhere.

    name: train-resnet
    partition: gpu            # resource group; omit for the cluster's default
    nodes: 1
    gpus_per_node: 2
    time_limit: "02:00:00"    # [D-]HH:MM:SS, or minutes as a number
    interactive: false
    entry:                    # exactly one of: commands, script, image (+ command)
      commands: ["python train.py --epochs 10"]
    environment:
      python: "3.11"
      cuda: "12.1"
      conda: ["numpy=1.26"]
      pip: ["torch==2.3.0"]
      variables: {OMP_NUM_THREADS: "4"}

Every error names the file, the line and the field. The cluster's rules from `[executor]` are
applied here, once, so the local and Slurm executors see the same tidied request: GPUs per node
are rounded up to a power of two (jobs then pack onto nodes without leaving odd holes), and an
interactive job may hold at most `interactive_max_gpus` GPUs.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any

import yaml

from sing.digits import ascii_digits
from sing.errors import UserError
from sing.executors.settings import ExecutorSettings

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+):(\d{2}):(\d{2})$")
# A package spec: name, then an optional version constraint (pip "==2.3", ">=1", conda "=1.26").
PACKAGE_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9_.\-]*(?:\[[^\]]*\])?)\s*(.*?)\s*$")

TOP_KEYS = ("name", "partition", "nodes", "gpus_per_node", "time_limit", "interactive", "entry",
            "environment")  # fmt: skip
ENTRY_KEYS = ("commands", "script", "image", "command")
ENV_KEYS = ("python", "cuda", "conda", "pip", "variables")


@dataclasses.dataclass(frozen=True)
class Environment:
    python: str | None = None
    cuda: str | None = None
    conda: tuple[str, ...] = ()
    pip: tuple[str, ...] = ()
    variables: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class JobProfile:
    name: str
    commands: str  # the shell text to run (a script's content is embedded: self-contained)
    nodes: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    time_limit_s: int | None = None
    interactive: bool = False
    image: str | None = None  # run `commands` inside this container image
    environment: Environment = dataclasses.field(default_factory=Environment)
    source: str = "<profile>"
    notes: tuple[str, ...] = ()  # what the cluster rules changed, for the user to see

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def dependencies(self) -> dict[str, str | None]:
        """The declared software as {package: version or None}, kept with the job record."""
        env = self.environment
        out: dict[str, str | None] = {}
        for spec in (*env.conda, *env.pip):
            name, version = split_package(spec)
            out[name] = version
        if env.python:
            out["python"] = env.python
        if env.cuda:
            out["cuda"] = env.cuda
        if self.image:
            out["image"] = self.image
        return out


def split_package(spec: str) -> tuple[str, str | None]:
    """'torch==2.3.0' -> ('torch', '2.3.0'); 'numpy=1.26' -> ('numpy', '1.26'); '>=' kept."""
    match = PACKAGE_RE.match(spec)
    name, constraint = (match.group(1), match.group(2)) if match else (spec, "")
    if constraint.startswith("=="):
        return name, constraint[2:].strip()
    if constraint.startswith("=") and not constraint.startswith("=>"):
        return name, constraint[1:].strip()
    return name, constraint or None


def load_profile(path: str | Path, settings: ExecutorSettings | None = None) -> JobProfile:
    """Read, validate and tidy a profile file; raises UserError naming file, line and field."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise UserError(f"{path}: cannot read job profile: {err.strerror}") from err
    return parse_profile(text, str(path), settings or ExecutorSettings(), base_dir=path.parent)


def parse_profile(
    text: str, source: str, settings: ExecutorSettings, base_dir: Path | None = None
) -> JobProfile:
    reader = _Reader(text, source)
    top = reader.mapping(reader.root, "profile", TOP_KEYS)
    name = reader.string(top, "name", required=True)
    if not NAME_RE.match(name):
        raise reader.error(top["name"], "name", "use letters, digits, '_', '.', '-' (max 64)")
    nodes = reader.integer(top, "nodes", default=1, minimum=1)
    gpus = reader.integer(top, "gpus_per_node", default=0, minimum=0)
    interactive = reader.boolean(top, "interactive", default=False)
    commands, image = _entry(reader, top, base_dir or Path("."))

    notes: list[str] = []
    tidy = _next_power_of_two(gpus)
    if tidy != gpus:
        notes.append(f"gpus_per_node {gpus} rounded up to {tidy} (cluster rule: powers of two)")
    if tidy > settings.max_gpus_per_node:
        raise reader.error(
            top["gpus_per_node"], "gpus_per_node",
            f"{gpus} GPUs per node exceeds this cluster's {settings.max_gpus_per_node}",
        )  # fmt: skip
    if interactive and nodes * tidy > settings.interactive_max_gpus:
        raise reader.error(
            top["interactive"], "interactive",
            f"interactive jobs may use at most {settings.interactive_max_gpus} GPUs; this one "
            f"asks for {nodes * tidy} ({nodes} node(s) x {tidy})",
        )  # fmt: skip
    return JobProfile(
        name=name,
        commands=commands,
        nodes=nodes,
        gpus_per_node=tidy,
        partition=reader.string(top, "partition"),
        time_limit_s=_time_limit(reader, top),
        interactive=interactive,
        image=image,
        environment=_environment(reader, top),
        source=source,
        notes=tuple(notes),
    )


def _entry(reader: _Reader, top: dict[str, yaml.Node], base_dir: Path) -> tuple[str, str | None]:
    if "entry" not in top:
        raise reader.error(reader.root, "entry", "missing; give commands, script or image")
    entry = reader.mapping(top["entry"], "entry", ENTRY_KEYS)
    given = [k for k in ("commands", "script", "image") if k in entry]
    if len(given) != 1:
        raise reader.error(
            top["entry"],
            "entry",
            f"give one of commands, script, image (got {given or 'none'})",
        )
    if "command" in entry and "image" not in entry:
        raise reader.error(entry["command"], "entry.command", "only used with entry.image")
    if "commands" in entry:
        return "\n".join(reader.strings(entry, "commands", "entry.commands")), None
    if "script" in entry:
        script = base_dir / reader.string(entry, "script", field="entry.script")
        if not script.is_file():
            raise reader.error(entry["script"], "entry.script", f"file {script} does not exist")
        return script.read_text(), None
    command = reader.string(entry, "command", field="entry.command", required=True)
    return command, reader.string(entry, "image", field="entry.image")


def _environment(reader: _Reader, top: dict[str, yaml.Node]) -> Environment:
    if "environment" not in top:
        return Environment()
    env = reader.mapping(top["environment"], "environment", ENV_KEYS)
    variables: dict[str, str] = {}
    if "variables" in env:
        raw = reader.mapping(env["variables"], "environment.variables")
        for key in raw:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise reader.error(env["variables"], "environment.variables", f"bad name {key!r}")
            variables[key] = reader.string(
                raw, key, field=f"environment.variables.{key}", scalar=True
            )
    return Environment(
        python=reader.string(env, "python", field="environment.python", scalar=True),
        cuda=reader.string(env, "cuda", field="environment.cuda", scalar=True),
        conda=tuple(reader.strings(env, "conda", "environment.conda")),
        pip=tuple(reader.strings(env, "pip", "environment.pip")),
        variables=variables,
    )


def _time_limit(reader: _Reader, top: dict[str, yaml.Node]) -> int | None:
    if "time_limit" not in top:
        return None
    node = top["time_limit"]
    # The text as written: YAML 1.1 would read an unquoted 02:00:00 as the base-60 number 7200.
    text = str(node.value).strip() if isinstance(node, yaml.ScalarNode) else ""
    match = TIME_RE.match(text)
    if ascii_digits(text):
        seconds = int(text) * 60
    elif match:
        days, hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
        seconds = days * 86400 + hours * 3600 + minutes * 60 + secs
    else:
        raise reader.error(
            node, "time_limit", f"{text or node.tag!r} is not [D-]HH:MM:SS or a number of minutes"
        )
    if seconds <= 0:
        raise reader.error(node, "time_limit", "must be longer than zero")
    return seconds


def _next_power_of_two(n: int) -> int:
    return 0 if n == 0 else 1 << (n - 1).bit_length()


class _Reader:
    """Typed access to a composed YAML tree that can point at the line of any field."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        try:
            self._loader = yaml.SafeLoader(text)  # refuses control characters at once
            root = self._loader.get_single_node()
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{source}:{mark.line + 1}" if mark else source
            raise UserError(f"{where}: not valid YAML: {getattr(err, 'problem', err)}") from err
        if root is None:
            raise UserError(f"{source}: empty job profile")
        self.root: yaml.Node = root

    def error(self, node: yaml.Node, field: str, problem: str) -> UserError:
        return UserError(f"{self.source}:{node.start_mark.line + 1}: {field}: {problem}")

    def value(self, node: yaml.Node) -> Any:
        try:
            return self._loader.construct_object(node, deep=True)
        # PyYAML's constructors fail in all these ways on a value that does not fit its tag
        # (`2001-13-45`, `!!timestamp x`, `!!binary *`).
        except (yaml.YAMLError, ValueError, TypeError, AttributeError) as err:
            problem = getattr(err, "problem", None) or err
            where = f"{self.source}:{node.start_mark.line + 1}"
            raise UserError(f"{where}: bad value: {problem}") from err

    def mapping(
        self, node: yaml.Node, field: str, allowed: tuple[str, ...] | None = None
    ) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, field, "must be a mapping of key: value lines")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = str(self.value(key_node))
            if allowed is not None and key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.error(
                    key_node, field, f"unknown key {key!r}{hint}; known: {', '.join(allowed)}"
                )
            if key in out:
                raise self.error(key_node, field, f"key {key!r} given twice")
            out[key] = value_node
        return out

    def string(
        self,
        fields: dict[str, yaml.Node],
        key: str,
        field: str | None = None,
        required: bool = False,
        scalar: bool = False,
    ) -> str | None:
        """A text field; with `scalar`, numbers are taken as text too (python: 3.11)."""
        field = field or key
        if key not in fields:
            if required:
                raise self.error(self.root, field, "missing")
            return None
        value = self.value(fields[key])
        if scalar and isinstance(value, int | float) and not isinstance(value, bool):
            return fields[key].value  # the text as written: 3.10 stays "3.10"
        if not isinstance(value, str) or not value.strip():
            raise self.error(fields[key], field, f"must be non-empty text, got {value!r}")
        return value.strip()

    def strings(self, fields: dict[str, yaml.Node], key: str, field: str) -> list[str]:
        if key not in fields:
            return []
        value = self.value(fields[key])
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
            raise self.error(fields[key], field, f"must be text or a list of text, got {value!r}")
        return items

    def integer(self, fields: dict[str, yaml.Node], key: str, default: int, minimum: int) -> int:
        if key not in fields:
            return default
        value = self.value(fields[key])
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.error(fields[key], key, f"must be a whole number >= {minimum}: {value!r}")
        return value

    def boolean(self, fields: dict[str, yaml.Node], key: str, default: bool) -> bool:
        if key not in fields:
            return default
        value = self.value(fields[key])
        if not isinstance(value, bool):
            raise self.error(fields[key], key, f"must be true or false, got {value!r}")
        return value
