"""``kvoffload cache ls | verify | clear``: see, check and remove what disk tiers keep.

Directories: every ``--path`` given, the disk tiers of ``--config`` (a YAML file or a packaged
example's name), else the per-user cache directory that a disk tier without a path uses.
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
                           help="only the files of this namespace digest (as ls shows it)")
        p.set_defaults(func=cmd_cache)


def _directories(args: argparse.Namespace) -> tuple[list[Path], OffloadConfig | None]:
    from kvoffload.config import OffloadConfig, default_cache_dir

    dirs = [Path(p).expanduser() for p in args.path]
    cfg = None
    if args.config is not None:
        cfg = OffloadConfig.coerce(args.config)
        dirs += [Path(t.path) for t in cfg.tiers if t.medium == "disk" and t.path]
    return list(dict.fromkeys(dirs or [default_cache_dir()])), cfg


def _size(n: int) -> str:
    from kvoffload.config import format_bytes

    return format_bytes(n)


def _describe(entry: CacheFile) -> str:
    lay = entry.layout
    if lay is None:
        return f"  {entry.path.name}: not a tier file of this version (no engine reads it); {_size(entry.disk_bytes)}"
    ns = entry.namespace
    what = ", ".join(f"{k} {v[:24]}" for k, v in ns.items() if k in ("model", "dtype", "layout")) or "unknown"
    rank = f", rank {lay.rank} of {lay.world_size}" if lay.world_size > 1 else ""
    used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.last_used))
    state = f"in use by {entry.holder}" if entry.holder else "not in use"
    torn = f" ({entry.torn} torn)" if entry.torn else ""
    return (f"  {entry.path.name}: namespace {lay.digest} ({what}){rank}\n"
            f"    {entry.records:,} records{torn} of {lay.num_slots:,} slots ({lay.block_tokens} tokens, "
            f"{_size(lay.block_bytes)} each), {_size(entry.disk_bytes)} on disk of {_size(entry.capacity_bytes)}, "
            f"last written {used}, {state}")


def cmd_cache(args: argparse.Namespace) -> int:
    from kvoffload.auth import RecordTagger
    from kvoffload.config import ConfigError
    from kvoffload.tiers.disk.inventory import clear_files, list_files, verify_file

    try:
        dirs, cfg = _directories(args)
        secret = cfg.auth.load_secret() if cfg is not None else None
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    listing = {d: (list_files(d) if d.is_dir() else []) for d in dirs}
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
    chosen = [e for es in listing.values() for e in es
              if args.namespace is None or (e.layout is not None and e.layout.digest == args.namespace)]
    if args.namespace is not None and not chosen:
        print(f"error: --namespace {args.namespace}: no tier file of that namespace in "
              f"{', '.join(map(str, dirs))}; `kvoffload cache ls` shows the digests", file=sys.stderr)
        return 2
    removed, refused = clear_files(chosen)
    for path in removed:
        print(f"removed {path}")
    for line in refused:
        print(f"refused: {line}", file=sys.stderr)
    if not removed and not refused:
        print("nothing to clear")
    return 1 if refused else 0
