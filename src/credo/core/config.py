"""Configs are frozen dataclasses: loaded from YAML, overridden with `key.sub=value`, validated on load.

Every command is configured the same way: defaults <- a preset (`base`) <- the `--config` YAML file <-
the command's shortcut flags <- `--set key.sub=value` (`load_config`). An unknown key or a value of the
wrong type is an error that names the field (`train.lr`); each dataclass's `__post_init__` checks ranges,
and `from_dict` gives a nested error its full dotted path (`train.loss.eps_low`).

Each field is documented by the string literal right under it (CleanRL's convention), which
`describe` reads back for `--help-config`: `lr: float = 2e-5` followed, on the next line, by the
string "AdamW learning rate." as a bare statement.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import inspect
import json
import math
import re
import textwrap
import types
import typing
from typing import Any, TypeVar

import yaml

C = TypeVar("C")


class UserError(ValueError):
    """An error the user caused and can fix (bad data row, file, option): the CLI prints its one-line
    message and exits 2. Anything else is a bug and keeps its traceback."""


class ConfigError(UserError):
    """A config value that cannot be used; the message names the field."""


SEED_LIMIT = 2**32
"""Seeds are 0 <= seed < 2**32, the range every generator credo seeds (torch, Python's random) accepts."""


def yaml_error_text(err: yaml.YAMLError) -> str:
    """What is wrong, and where ('line 3, column 7: ...'), from a YAML error, in one line: its own str is a
    few lines, the first of which ('while parsing a flow sequence') says neither."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return " ".join(f"{where}{problem}{', ' + context if context else ''}".split())


def parse_yaml_value(raw: str, where: str) -> Any:
    """A `key=value` value parsed as a YAML scalar or flow collection; malformed YAML is an error naming `where`."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: {raw!r} is not valid YAML ({yaml_error_text(err)})") from None


def _coerce(value: Any, hint: Any, name: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in typing.get_args(hint):
                return None
            raise ConfigError(f"{name} may not be null")
        return _coerce(value, options[0], name)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a mapping of {hint.__name__} fields, got {value!r}")
        return from_dict(hint, value, prefix=name + ".")
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a mapping (key: value), got {value!r}")
        return value
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v != ""]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name} must be a list (or a comma-separated string), got {value!r}")
        inner = typing.get_args(hint)[0] if typing.get_args(hint) else str
        return tuple(_coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        return _coerce_bool(value, name)
    if hint in (int, float):
        return _coerce_number(value, hint, name)
    if hint is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{name} must be a string, got {value!r}")
        return str(value)
    return value


def _coerce_bool(value: Any, name: str) -> bool:
    """A bool from YAML or the command line: true/false, yes/no, 1/0 (in any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def _coerce_number(value: Any, hint: type, name: str) -> int | float:
    """An int (decimal, or 0x/0o/0b from a string) or a finite float; a field named `seed` in 0..SEED_LIMIT-1."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    kind = 'a number' if hint is float else 'an integer'
    try:
        number = float(value) if hint is float else int(str(value), 0) if isinstance(value, str) else value
        if not isinstance(number, (int, float)):
            raise TypeError
        if isinstance(number, float) and not math.isfinite(number):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
        if hint is int and (not isinstance(number, int) and not float(number).is_integer()):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        number = hint(number)
    except (TypeError, ValueError, OverflowError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{name} must be {kind}, got {_short(value)}") from None
    if name.rsplit(".", 1)[-1] == "seed" and not 0 <= number < SEED_LIMIT:
        # every config's seed: one check here rather than one per class
        raise ConfigError(f"{name} must be in 0..{SEED_LIMIT - 1}, got {_short(value)}")
    return number


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def from_dict(cls: type[C], data: dict[str, Any], prefix: str = "") -> C:
    """Build dataclass `cls` from a (possibly nested) dict; unknown keys are errors naming the field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(f"unknown config field '{prefix}{key}' (known: {', '.join(sorted(known))})")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as err:  # ConfigError included: its message gets the field's full dotted path
        raise ConfigError(_full_path(str(err), known, prefix)) from None


def _full_path(message: str, fields: set[str], prefix: str) -> str:
    """A range check names its field as its class sees it ('eps_low', 'credit.k'); the user needs the
    path from the top ('train.loss.eps_low'), which only the caller of from_dict knows."""
    head = message.split(" ", 1)[0].rstrip(":,")
    short, _, name = head.rpartition(".")
    if prefix and short and short.split(".")[0] in fields and not all(part in fields for part in name.split("/")):
        return prefix + message  # a check inside a field's own value: 'segmenter.name' -> 'credit.segmenter.name'
    if not prefix or not name or not all(part in fields for part in name.split("/")):
        return message
    if not short:
        return prefix + message
    return re.sub(r"(?<![\w.])" + re.escape(short + ".") + r"(?=\w)", prefix, message)


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain nested dicts. A field marked `metadata={"omit_default": True}` is left out while it
    holds its default: a field added to a config whose hash names shipped artefacts (an SFT start's asset
    folder) keeps the hash, and so the artefact, of every config that does not set it."""
    return {f.name: (to_dict(v) if dataclasses.is_dataclass(v) else _plain(v)) for f, v in
            ((f, getattr(config, f.name)) for f in dataclasses.fields(config)) if not _omitted(f, v)}


def _omitted(f: dataclasses.Field, value: Any) -> bool:
    if not f.metadata.get("omit_default"):
        return False
    if f.default is not dataclasses.MISSING:
        return value == f.default
    return f.default_factory is not dataclasses.MISSING and value == f.default_factory()


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """['train.lr=1e-5', 'task.max_terms=4'] -> nested dict (values parsed as YAML scalars)."""
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value")  # the CLI's check_overrides: an example
        key, raw = item.split("=", 1)
        value = parse_yaml_value(raw, f"--set {key.strip()}") if raw.strip() else ""
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        node[parts[-1]] = value
    return nested


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_yaml(path: str | None) -> dict[str, Any]:
    """The mapping in YAML file `path` ({} for None or an empty file); errors are one line naming the file."""
    if not path:
        return {}
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML ({yaml_error_text(err)})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def user_settings(path: str | None = None, overrides: list[str] | None = None,
                  flags: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the user asked for, as a nested dict: the YAML file <- shortcut flags <- `--set` overrides."""
    return merge(merge(read_yaml(path), flags or {}), parse_overrides(overrides or []))


def load_config(cls: type[C], path: str | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None, prefix: str = "", flags: dict[str, Any] | None = None) -> C:
    """Defaults <- `base` <- YAML file <- `flags` (a command's shortcut flags) <- overrides, validated into `cls`."""
    return from_dict(cls, merge(dict(base or {}), user_settings(path, overrides, flags)), prefix=prefix)


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """{field: doc} from the string literal written right under each field of dataclass `cls` or of a dataclass
    it inherits fields from (CleanRL's convention); fields without one are absent. Read from the source with `ast`."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(klass):
            docs.update(field_docs(klass))
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (e.g. a class made at run time)
        return docs
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)).body
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def describe(config: Any, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted path, value, doc) of every field of `config`, nested dataclasses flattened (`loss.eps_low`)."""
    rows: list[tuple[str, Any, str]] = []
    docs = field_docs(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            rows.extend(describe(value, prefix + f.name + "."))
        else:
            rows.append((prefix + f.name, value, docs.get(f.name, "")))
    return rows


def help_config(config: Any, title: str) -> str:
    """The `--help-config` text: every field as `path = value` (JSON), its doc indented under it."""
    lines = [title, ""]
    for path, value, doc in describe(config):
        head = f"{path} = {json.dumps(_plain(value))}"
        lines.append(head)
        lines.extend(textwrap.wrap(doc, 100, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def config_hash(config: Any, length: int = 12) -> str:
    blob = json.dumps(to_dict(config), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def dump_yaml(config: Any) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def check(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition; used by __post_init__ range checks."""
    if not condition:
        raise ConfigError(message)


# Upper bounds of the sizes a user sets. Each is far above any run this library is for (a GPU trainer's step is
# ~512 prompts x 16 completions; a benchmark's held-out set a few thousand problems), and each stops a typo
# from becoming an allocation that fails with a traceback or a problem list that is built for hours with
# no progress shown.
MAX_GROUP = 1024
"""Completions per prompt (train.group_size, audit.group_size)."""
MAX_STEP_COMPLETIONS = 65_536
"""Completions of one training step (prompts_per_step x group_size)."""
MAX_HELD_OUT = 100_000
"""Held-out problems of one evaluation (eval_n, final_eval_n, eval --n, sft.eval_n, audit traces)."""
MAX_SAMPLES = 1024
"""Samples per problem or per step boundary (eval --k, audit.k_ref)."""
MAX_EPOCHS = 100
"""Optimiser passes over one batch (train.epochs)."""
MAX_ROUNDS = 100
"""Sampling rounds of one step (train.dynamic_max_rounds)."""
MAX_NEW_TOKENS = 32_768
"""Generation limit of one completion (train.sampling.max_new_tokens, eval --max-new-tokens, sft)."""
MAX_LORA_RANK = 4096
"""LoRA rank (train.lora.r, sft.lora.r)."""


def check_in(value: Any, low: Any, high: Any, name: str) -> None:
    """ConfigError '<name> must be in <low>..<high>, got <value>' unless low <= value <= high."""
    check(low <= value <= high, f"{name} must be in {low}..{high:,}, got {value}" if isinstance(high, int)
          else f"{name} must be in {low}..{high}, got {value}")
