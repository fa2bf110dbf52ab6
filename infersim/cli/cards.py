"""`infersim cards ...`: import HF configs as model cards, list and check bundled cards."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import yaml

from infersim.cards.hf_import import card_from_hf_file
from infersim.cards.model import ModelCard, validate_model
from infersim.cards.registry import bundled_dir, bundled_names
from infersim.cards.schema import build, field_docs
from infersim.base.errors import InferSimError, shorten


_CARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def _import_hf(args: argparse.Namespace) -> int:
    if args.name is not None and not _CARD_NAME.match(args.name):
        raise InferSimError(f"--name {shorten(repr(args.name))}: a card name is 1 to 128 letters, digits, '.', '_', "
                            "'+' or '-' (it becomes the file name)")
    if args.name is not None and len(args.configs) > 1:
        raise InferSimError(f"--name {args.name}: names one card, and {len(args.configs)} configs were given; import "
                            "each config on its own to name it, or leave --name out (each card is then named from "
                            "its config)")
    cards = [_card_of(Path(config), args.name) for config in args.configs]  # every card checked before any is written
    if args.out == "-":
        for _path, _name, text in cards:
            print(text)
        return 0
    targets = _targets(cards, Path(args.out), args.force, args.configs)
    for target, (_path, _name, text) in zip(targets, cards):
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        except OSError as exc:
            raise InferSimError(f"{target}: cannot write the card: {exc.strerror or exc}") from None
    for target in targets:
        name = target.stem
        use = f"--model {name}" if target.parent.resolve() == (Path.cwd() / "models").resolve() else f"--model {target}"
        print(f"wrote {target} (run it with {use})")
    return 0


def _card_of(path: Path, name: str | None) -> tuple[Path, str, str]:
    """A config's card: (config path, card name, card YAML), validated."""
    fields = card_from_hf_file(path, name)
    validate_model(build(ModelCard, fields, str(path)), str(path))  # refuse to write an invalid card
    if fields.get("imported_as"):
        print(f"infersim: note: {path}: {fields['source'].split('; ', 1)[-1]}", file=sys.stderr)
    return path, fields["name"], card_yaml(fields)


def _targets(cards: list[tuple[Path, str, str]], out_dir: Path, force: bool, configs: list[str]) -> list[Path]:
    """The card files to write, refused up front: two configs making one card name, a card over one
    of the configs read, a file there without --force, or an --out that is no directory."""
    from infersim.base.outputs import check_output_path

    if out_dir.exists() and not out_dir.is_dir():
        raise InferSimError(f"--out {out_dir}: is a file, not a directory; give a directory for the cards")
    first: dict[str, Path] = {}
    for path, name, _text in cards:
        if name in first:
            raise InferSimError(f"{first[name]} and {path}: both make the card '{name}' ({out_dir / name}.yaml); "
                                "import them one at a time with --name, or rename a config file")
        first[name] = path
    targets = [out_dir / f"{name}.yaml" for _path, name, _text in cards]
    for target in targets:
        if out_dir.is_dir():
            check_output_path(target, "--out", {"CONFIG.json": configs})
        if os.path.lexists(target) and not force:
            raise InferSimError(f"{target} exists (use --force to overwrite)")
    return targets


def card_yaml(fields: dict) -> str:
    """A model card as YAML, each field followed by its meaning."""
    docs = {name: doc for name, _type, doc in field_docs(ModelCard)}
    lines = ["# InferSim model card (fields follow HuggingFace config names; see docs/inputs.md 'Model cards')"]
    order = {name: i for i, (name, _t, _d) in enumerate(field_docs(ModelCard))}
    for key, value in sorted(fields.items(), key=lambda kv: order.get(kv[0], len(order))):
        dumped = yaml.safe_dump({key: value}, default_flow_style=True, width=1000).strip()[1:-1]
        lines.append(f"{dumped:<44} # {docs.get(key, '')}".rstrip())
    return "\n".join(lines) + "\n"


def _list(args: argparse.Namespace) -> int:
    for kind in ("models", "hardware", "engines", "configs"):
        print(f"{kind} ({bundled_dir(kind)}): {', '.join(bundled_names(kind)) or 'none'}")
    print("names resolve forgivingly: any case and punctuation (vLLM, H100), a card's aliases (h100 -> h100-sxm, "
          "TensorRT-LLM -> trtllm), HF ids (Qwen/Qwen3-8B -> qwen3-8b)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    cards = subparsers.add_parser("cards", help="model and hardware cards: import HF configs, list bundled cards")
    sub = cards.add_subparsers(dest="cards_command", metavar="ACTION", required=True)
    imp = sub.add_parser("import-hf", help="write a model card from HuggingFace config.json file(s)")
    imp.add_argument("configs", nargs="+", metavar="CONFIG.json")
    imp.add_argument("--out", default="models", help="output directory, or - for stdout (default: models)")
    imp.add_argument("--name", default=None, help="card name (single config only; default from the file name)")
    imp.add_argument("--force", action="store_true", help="overwrite existing cards")
    imp.set_defaults(handler=_import_hf)
    lst = sub.add_parser("list", help="list bundled model, hardware and engine cards and example configs")
    lst.set_defaults(handler=_list)
