"""``kvoffload cache ls | verify | clear``: see, check and remove what disk tiers keep.

Directories: every ``--path`` given and the disk tiers of ``--config`` (a YAML file or a packaged
example's name); with neither, the per-user cache directory that a disk tier without a path
uses. A config without a disk tier is an error, never a fall-back to that directory. ``clear``
lists what it will remove and asks first (``--yes``: without asking; needed without a terminal).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvoffload.config import OffloadConfig
    from kvoffload.tiers.disk.inventory import CacheFile


def add_parser(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="list, verify or clear what disk tiers keep (files, namespaces, records)",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    for name, text in (("ls", "list each tier file: namespace, records, bytes on disk, last use, owner"),
                       ("verify", "read every record and check it as a load would (exit 1 if any fails)"),
                       ("clear", "remove tier files (never one an engine holds) and their namespace files")):
        p = cache_sub.add_parser(name, help=text, description=text)
        p.add_argument("--path", action="append", default=[], metavar="DIR",
                       help="a disk tier directory (repeatable; default: --config's, else the per-user cache)")
        p.add_argument("--config", default=None, metavar="FILE|NAME",
                       help="an offload config: its disk tiers' directories, and its auth for verify")
        if name == "ls":
            p.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")
        if name == "clear":
            p.add_argument("--namespace", default=None, metavar="DIGEST",
                           help="only the files of this namespace (or tier file) digest, as ls shows it")
            p.add_argument("--yes", action="store_true", help="remove without asking")
        p.set_defaults(func=cmd_cache)


def _directories(args: argparse.Namespace) -> tuple[list[Path], OffloadConfig | None]:
    from kvoffload.config import ConfigError, OffloadConfig, default_cache_dir

    dirs = [Path(p).expanduser() for p in args.path]
    cfg = None
    if args.config is not None:
        cfg = OffloadConfig.coerce(args.config)
        disk = [Path(t.path) for t in cfg.tiers if t.medium == "disk" and t.path]
        if not disk and not dirs:
            media = ", ".join(t.medium for t in cfg.tiers)
            raise ConfigError(f"--config {args.config}: it has no disk tier (its tiers: {media}); `kvoffload cache` "
                              "acts on disk tier directories: pass --path DIR to name one")
        dirs += disk
    return list(dict.fromkeys(dirs or [default_cache_dir()])), cfg


def _size(n: int) -> str:
    from kvoffload.config import format_bytes

    return format_bytes(n)


def _describe(entry: CacheFile) -> str:
    lay = entry.layout
    if lay is None:
        return f"  {entry.path.name}: not a tier file of this version (no engine reads it); {_size(entry.disk_bytes)}"
    ns = entry.namespace
    label = ns.get("label", "")
    what = ", ".join([*([f"model {label[-60:]}"] if label else []),
                      *(f"{k} {v[:24]}" for k, v in ns.items() if k in ("dtype", "layout") or (k == "model" and not label))
                      ]) or "unknown"
    rank = f", rank {lay.rank} of {lay.world_size}" if lay.world_size > 1 else ""
    digest = entry.namespace_digest or "unknown (no namespace file)"
    if digest != lay.digest:
        digest += f", tier {lay.digest}"  # the namespace folded with a secret's id
    used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.last_used))
    state = f"in use by {entry.holder}" if entry.holder else "not in use"
    torn = f" ({entry.torn} torn)" if entry.torn else ""
    return (f"  {entry.path.name}: namespace {digest} ({what}){rank}\n"
            f"    {entry.records:,} records{torn} of {lay.num_slots:,} slots ({lay.block_tokens} tokens, "
            f"{_size(lay.block_bytes)} each), {_size(entry.disk_bytes)} on disk of {_size(entry.capacity_bytes)}, "
            f"last written {used}, {state}")


def cmd_cache(args: argparse.Namespace) -> int:
    from kvoffload.auth import RecordTagger
    from kvoffload.config import ConfigError
    from kvoffload.tiers.disk.inventory import list_files, verify_file

    try:
        dirs, cfg = _directories(args)
        secret = cfg.auth.load_secret() if cfg is not None else None
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    listing: dict[Path, list[CacheFile]] = {}
    for d in dirs:
        entries, skipped = list_files(d) if d.is_dir() else ([], [])
        listing[d] = entries
        for line in skipped:
            print(f"skipped {line}", file=sys.stderr)
    if args.cache_command == "ls":
        if args.json:
            print(json.dumps({str(d): [e.as_dict() for e in es] for d, es in listing.items()}, indent=1))
            return 0
        for d, entries in listing.items():
            print(f"{d}: " + (f"{len(entries)} tier file(s)" if entries else "no disk tier files"))
            for entry in entries:
                print(_describe(entry))
        return 0
    if args.cache_command == "verify":
        failed = 0
        for d, entries in listing.items():
            for entry in entries:
                tagger = None
                if secret is not None and cfg is not None:
                    tagger = RecordTagger(secret, entry.file_digest, cfg.auth.algorithm)
                r = verify_file(entry, tagger)
                bad = sum(r.failed.values())
                failed += bad
                why = f", {bad} failed ({', '.join(f'{k} {v}' for k, v in sorted(r.failed.items()))})" if bad else ""
                print(f"{entry.path}: {r.intact:,} intact{why}")
            if not entries:
                print(f"{d}: no disk tier files")
        if failed and secret is None:
            print("records written with a shared secret fail the plain checksum: pass --config with its auth",
                  file=sys.stderr)
        return 1 if failed else 0
    return _clear(args, dirs, listing)


def _clear(args: argparse.Namespace, dirs: list[Path], listing: dict[Path, list[CacheFile]]) -> int:
    from kvoffload.tiers.disk.inventory import clear_files, orphan_namespace_files

    chosen = [e for es in listing.values() for e in es
              if args.namespace is None or args.namespace in (e.namespace_digest, e.layout and e.layout.digest)]
    if args.namespace is not None and not chosen:
        print(f"error: --namespace {args.namespace}: no tier file of that namespace in "
              f"{', '.join(map(str, dirs))}; `kvoffload cache ls` shows the digests", file=sys.stderr)
        return 2
    free = [e for e in chosen if e.holder is None]
    going = {e.path for e in free}
    plan = [f"{e.path} ({_size(e.disk_bytes)})" for e in free]
    plan += [str(p) for d in dirs if d.is_dir() for p in orphan_namespace_files(d, going)]
    for e in chosen:
        if e.holder is not None:
            print(f"kept: {e.path}: in use by {e.holder}", file=sys.stderr)
    if plan and not args.yes:
        print("will remove:\n  " + "\n  ".join(plan))
        if not sys.stdin.isatty():
            print(f"error: {len(plan)} file(s) to remove; pass --yes to remove them without asking", file=sys.stderr)
            return 2
        if input("remove these? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    removed, refused = clear_files(chosen)
    for path in removed:
        print(f"removed {path}")
    for line in refused:
        print(f"refused: {line}", file=sys.stderr)
    if not removed and not refused:
        print("nothing to clear")
    return 1 if refused else 0
