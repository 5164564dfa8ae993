"""Reading TOML config files for config.py: parsed files cached by content, a table that checks its keys and values
and names the file and key in every error, files found in the folder or in an installed package. Only the standard
library: doit loads it every run."""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from pathlib import Path

from ..errors import ConfigError

SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")  # TOML's bare keys; any other key is shown quoted, as TOML writes it


def shown_key(key: str) -> str:
    """A key as TOML writes it, for messages: bare, or quoted with anything unprintable escaped (so an error stays one
    readable line whatever the key holds: empty, spaces, newlines, control or direction characters)."""
    if BARE_KEY.match(key):
        return key
    body = "".join(c if c.isprintable() and c not in '"\\' else
                   f"\\{c}" if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
                   for c in key)
    return f'"{body}"'


def read_toml(path: Path, cache: "TomlCache | None" = None) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a TOML file") from None
    if cache is not None:
        found = cache.get(path, raw)
        if found is not None:
            return found
    import tomllib  # pure Python, as is its parse: a no-op build takes the parsed files from the cache instead
    try:
        doc = tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8: byte {e.object[e.start]:#04x} at offset {e.start} (TOML files are "
                          "UTF-8 text)") from None
    if cache is not None:
        cache.put(path, raw, doc)
    return doc


class TomlCache:
    """Parsed TOML files by the xxh3 of their bytes, kept as JSON (out/.build-state/toml-cache.json): tomllib is pure
    Python, and its import and a parse of each model.toml were most of the config's share of a no-op build. Keyed by
    content, so an edit is never missed however fast it follows the last one; a file's old entry is replaced."""

    def __init__(self, path: str):
        self.path = path
        self.dirty = False
        try:
            with open(path) as f:
                self.entries = json.load(f)
            if not isinstance(self.entries, dict):
                self.entries = {}
        except (OSError, ValueError):
            self.entries = {}  # none yet, or damaged: the files are parsed again

    @staticmethod
    def _digest(raw: bytes) -> str:
        import xxhash
        return xxhash.xxh3_128_hexdigest(raw)

    def get(self, path: Path, raw: bytes) -> dict | None:
        entry = self.entries.get(str(path))
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == self._digest(raw):
            return entry[1]
        return None

    def put(self, path: Path, raw: bytes, doc: dict) -> None:
        try:
            json.dumps(doc)
        except (TypeError, ValueError):
            return  # TOML dates and times have no JSON form: such a file is parsed every time
        self.entries[str(path)] = [self._digest(raw), doc]
        self.dirty = True

    def save(self) -> None:
        if self.dirty:
            from ..plumbing.files import atomic_write_text
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            try:
                atomic_write_text(self.path, json.dumps(self.entries, separators=(",", ":")))
            except OSError:
                pass  # a read-only or full out/: parsing again next time is the only cost
            self.dirty = False


TYPE_NAMES = {dict: "a table", list: "a list", str: "a string", int: "an integer", float: "a number",
              bool: "true or false"}


class _Table:
    """One TOML table with the file and key path it came from, for error messages."""

    def __init__(self, path: Path, where: str, data: object):
        self.path, self.where = path, where
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: {where or 'top level'}: expected a table, got {data!r}")
        self.data = data

    def error(self, key: str, message: str) -> ConfigError:
        place = f"{self.where} {key}" if self.where else key
        return ConfigError(f"{self.path}: {place}: {message}")

    def check_keys(self, allowed: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.error(shown_key(key), f"unknown key (allowed: {', '.join(allowed)})")

    def get(self, key: str, kind: type | tuple, default=..., choices: tuple | None = None):
        if key not in self.data:
            if default is ...:
                raise self.error(shown_key(key), "missing")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # TOML booleans are ints in Python; do not let `true` pass as a number.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(TYPE_NAMES.get(k, k.__name__) for k in kinds)
            raise self.error(shown_key(key), f"expected {names}, got {value!r}")
        if choices is not None and value not in choices:
            raise self.error(shown_key(key), f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
        return value

    def strings(self, key: str, default=..., what: str = "strings") -> list[str]:
        """A list of strings (file names, chip names, tensor names)."""
        value = self.get(key, list, default)
        for item in value:
            if not isinstance(item, str):
                raise self.error(shown_key(key), f"expected a list of {what}, got {item!r} in it")
        return value

    def number(self, key: str, kind: type | tuple, default=..., low=None, high=None, why: str = ""):
        """An int or float within [low, high] (NaN never is)."""
        value = self.get(key, kind, default)
        if value is None:
            return value
        if value != value or (low is not None and value < low) or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"at most {high}" if low is None else \
                f"between {low} and {high}"
            raise self.error(shown_key(key), f"must be {bounds}{why}, got {value!r}")
        return value

    def table(self, key: str, default=...) -> "_Table":
        if key not in self.data and default is not ...:
            return _Table(self.path, self._sub(key), default)
        return _Table(self.path, self._sub(key), self.get(key, dict))

    def _sub(self, key: str) -> str:
        key = shown_key(key)
        return f"[{key}]" if not self.where else f"{self.where[:-1]}.{key}]"

    def name(self, key: str, value: str) -> str:
        if not SAFE_NAME.match(value) or value in (".", ".."):
            raise self.error(key, f"name {value!r} is not allowed: use letters, digits, '_', '-' or '.', "
                                  "no slashes (it becomes a folder under out/)")
        return value


def resolve_file(ref: str, folder: Path, where: str, what: str = "checkpoint") -> Path:
    """A path relative to the model folder, or pkg:<module>/<path> inside an installed package."""
    if ref.startswith("pkg:"):
        module, _, inner = ref[4:].partition("/")
        package = package_folder(module) if module else None
        if package is None:
            raise ConfigError(f"{where}: {ref}: package '{module}' is not installed")
        path = package / inner
    else:
        path = folder / ref
    if not path.is_file():
        raise ConfigError(f"{where}: {what} {ref} not found (looked for {path})")
    return path


@functools.cache
def package_folder(module: str) -> Path | None:
    """Where an installed package is, found without importing it; once per load (each task asks for its
    checkpoints: find_spec walks sys.path every time, ~0.1 ms)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])
