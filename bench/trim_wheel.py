"""Repack a wheel without some of its files, so it fits the GPU machine's upload limit.

    python bench/trim_wheel.py IN.whl OUT_DIR --drop 'GLOB' ... [--keep 'GLOB' ...]
        [--sub PATH REGEX REPLACEMENT ...]

A file is left out when it matches a --drop glob and no --keep glob (fnmatch,
where `*` also matches `/`); `--sub` edits a kept text file with `re.sub`
(multiline), e.g. to stop importing the modules whose binaries were dropped. RECORD is rewritten with the new hashes and the
wheel gets build tag `1trim`, so it is never mistaken for the upstream file.
Used by bench/gpu_wheels.sh for envpool and envpool-assets, whose full wheels
(53 MB and 62 MB) hold every env family when the benchmarks need two.
"""
from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import re
import zipfile
from pathlib import Path

BUILD_TAG = "1trim"


def _hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def trim(src: Path, out_dir: Path, drop: list[str], keep: list[str],
         subs: list[tuple[str, str, str]] = ()) -> Path:
    parts = src.name[:-len(".whl")].split("-")
    if len(parts) == 6:  # already has a build tag
        del parts[2]
    name, version, *tags = parts
    dest = out_dir / ("-".join([name, version, BUILD_TAG, *tags]) + ".whl")
    kept, dropped = [], 0
    with zipfile.ZipFile(src) as zin:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        wheel_meta = record[:-len("RECORD")] + "WHEEL"
        for info in zin.infolist():
            path = info.filename
            if path == record:
                continue
            if any(fnmatch.fnmatch(path, g) for g in drop) and \
                    not any(fnmatch.fnmatch(path, g) for g in keep):
                dropped += 1
                continue
            data = zin.read(info)
            for sub_path, pattern, repl in subs:
                if path == sub_path:
                    text, count = re.subn(pattern, repl, data.decode(), flags=re.MULTILINE)
                    if not count:
                        raise SystemExit(f"--sub {sub_path}: {pattern!r} matched nothing")
                    data = text.encode()
            if path == wheel_meta:
                lines = [l for l in data.decode().splitlines() if not l.startswith("Build:")]
                data = ("\n".join(lines + [f"Build: {BUILD_TAG}"]) + "\n").encode()
            kept.append((info, data))
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    for info, data in kept:
        writer.writerow([info.filename, _hash(data), len(data)])
    writer.writerow([record, "", ""])
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info, data in kept:
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        zout.writestr(record, rows.getvalue())
    print(f"{src.name}: kept {len(kept)} files, dropped {dropped} -> {dest} "
          f"({dest.stat().st_size / 2**20:.1f} MiB)")
    return dest


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheel", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--drop", action="append", default=[], help="glob of files to leave out")
    p.add_argument("--keep", action="append", default=[], help="glob that overrides --drop")
    p.add_argument("--sub", nargs=3, action="append", default=[],
                   metavar=("PATH", "REGEX", "REPLACEMENT"), help="re.sub in a kept file")
    args = p.parse_args(argv)
    trim(args.wheel, args.out_dir, args.drop, args.keep, [tuple(s) for s in args.sub])


if __name__ == "__main__":
    main()
