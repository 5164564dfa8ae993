"""Keep a variant found by `doit tune:<model>/<variant>`: append its section to the model's model.toml.

    python -m build_rules.tuning apply out/mtcnn/tuning/w8a8.tuned.toml [--name NAME] [--to models/mtcnn/model.toml]

Why a command and not the tune task itself: model.toml is an input of every task (a task that rewrote it would
make its own build stale and write outside out/), and a person should look at the measured numbers before a
variant joins the build. The section is appended as it was written (with its comments), under a new name if
--name is given; the result is loaded once as the build would load it, and model.toml is left unchanged
when that fails (e.g. the name is taken).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .configuration.config import ConfigError, load_chips, load_model
from .plumbing.files import atomic_write_text


def apply(tuned_toml: Path, model_toml: Path | None = None, name: str | None = None,
          chips_toml: Path = Path("chips.toml")) -> str:
    """Append the tuned section to model.toml; returns the variant name."""
    tuned_toml = Path(tuned_toml)
    try:
        text = tuned_toml.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{tuned_toml}: no such file: `doit tune:<model>/<variant>` writes it, as "
                          "out/<model>/tuning/<variant>.tuned.toml") from None
    found = re.search(r"^\[variants\.(\"[^\"]+\"|[A-Za-z0-9_.-]+?)\]\s*$", text, re.M)
    if not found:
        nothing = "Nothing to add:" in text  # the tune found the variant good as it is
        by_hand = "Nothing to apply:" in text  # the chosen variant cannot be written as one that inherits
        raise ConfigError(f"{tuned_toml}: no [variants.<name>] section"
                          + (": the tuned variant meets its targets as it is, nothing to apply" if nothing else "")
                          + (": the proposal cannot inherit from the variant; its comments say what to write "
                             "into model.toml by hand" if by_hand else ""))
    old = found.group(1)
    old_name = json.loads(old) if old.startswith('"') else old
    model_toml = Path(model_toml) if model_toml is not None else model_toml_of(tuned_toml)
    new_name = name or old_name
    if new_name != old_name:
        quoted = new_name if re.fullmatch(r"[A-Za-z0-9_-]+", new_name) else json.dumps(new_name)
        text = text.replace(f"[variants.{old}]", f"[variants.{quoted}]").replace(f"[variants.{old}.",
                                                                                 f"[variants.{quoted}.")
    original = model_toml.read_text()
    from .configuration.config import read_toml
    if new_name in read_toml(model_toml).get("variants", {}):
        raise ConfigError(f"{model_toml} already has a variant {new_name!r}; choose another with --name")
    atomic_write_text(model_toml, original.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")
    try:
        model = load_model(model_toml.parent, load_chips(chips_toml))
        if new_name not in model.variants:
            raise ConfigError(f"{model_toml}: variant {new_name!r} did not load")
    except Exception:
        atomic_write_text(model_toml, original)
        raise
    return new_name


def model_toml_of(tuned_toml: Path) -> Path:
    """The model.toml the tune task read (its .tuned.json beside the proposal says)."""
    info = tuned_toml.with_name(tuned_toml.name.replace(".tuned.toml", ".tuned.json"))
    try:
        return Path(json.loads(info.read_text())["model_toml"])
    except (OSError, ValueError, KeyError):
        raise ConfigError(f"{tuned_toml}: cannot tell which model.toml it belongs to; pass --to") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build_rules.tuning", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("apply", help="append a tuned variant to model.toml")
    a.add_argument("tuned_toml")
    a.add_argument("--to", help="model.toml (default: the one the tune task read)")
    a.add_argument("--name", help="variant name (default: the one in the file)")
    a.add_argument("--chips", default="chips.toml")
    args = parser.parse_args(argv)
    try:
        name = apply(Path(args.tuned_toml), Path(args.to) if args.to else None, args.name, Path(args.chips))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    model_toml = Path(args.to) if args.to else model_toml_of(Path(args.tuned_toml))
    model = model_toml.parent.name  # (a model's name is its folder's)
    print(f"added [variants.{name}] to {model_toml}; build it with: doit {model} (and its report: doit report:{model})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
