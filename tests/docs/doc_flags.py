#!/usr/bin/env python3
"""docs/command-line.md lists every flag of dp-ps and dp-worker, as their
--help prints them, and no flag that neither binary has.

A flag of a binary counts as documented when `--name` appears in a
paragraph about that binary: one that starts with `dp-ps` or `dp-worker`,
or with "Both". A flag mentioned anywhere else on the page (the exit codes,
SIGTERM) is only a cross-reference: it must exist, but it documents
nothing.

Usage: doc_flags.py --source_dir DIR --ps BIN --worker BIN
"""

import argparse
import os
import re
import subprocess
import sys

PAGE = os.path.join("docs", "command-line.md")
# A flag line of --help: "  --name  help (default: '...')".
HELP_FLAG = re.compile(r"^  --([a-z0-9_]+)  ", re.MULTILINE)
# `--name` or `--name=value` in inline code.
DOC_FLAG = re.compile(r"`--([a-z0-9_]+)[=`]")
# What every binary has beside its flags (the last line of --help).
BUILTIN = {"help", "version"}


def help_flags(binary):
    """The flags `binary --help` lists, in its order."""
    run = subprocess.run([binary, "--help"], capture_output=True, text=True,
                         timeout=60, env={"PATH": os.environ.get("PATH", "")})
    if run.returncode != 0:
        raise RuntimeError(f"{binary} --help exited {run.returncode}:\n"
                           f"{run.stdout}{run.stderr}")
    flags = HELP_FLAG.findall(run.stdout)
    if not flags:
        raise RuntimeError(f"{binary} --help lists no flag line "
                           f"('  --name  help'):\n{run.stdout}")
    return flags


def documented(page_text):
    """{"dp-ps": set, "dp-worker": set, "all": set} of the flags the page
    names: those of the paragraphs about each binary (with "Both" in each),
    and every flag named anywhere."""
    found = {"dp-ps": set(), "dp-worker": set(), "all": set()}
    for paragraph in re.split(r"\n\s*\n", page_text):
        flags = set(DOC_FLAG.findall(paragraph))
        found["all"] |= flags
        start = paragraph.lstrip()
        if start.startswith("Both"):
            found["dp-ps"] |= flags
            found["dp-worker"] |= flags
        elif start.startswith("`dp-ps`"):
            found["dp-ps"] |= flags
        elif start.startswith("`dp-worker`"):
            found["dp-worker"] |= flags
    return found


def problems(source_dir, binaries):
    """['problem'] for every flag of a binary that the page does not
    document for it, and every flag the page names that no binary has."""
    with open(os.path.join(source_dir, PAGE), encoding="utf-8") as f:
        docs = documented(f.read())
    out = []
    every = set(BUILTIN)
    for name, binary in binaries.items():
        flags = help_flags(binary)
        every |= set(flags)
        for flag in flags:
            if flag not in docs[name]:
                out.append(f"{name} --{flag} is not documented in {PAGE} (no "
                           f"paragraph starting with `{name}` or \"Both\" "
                           f"names it)")
    for flag in sorted(docs["all"] - every):
        out.append(f"{PAGE} names --{flag}, which neither dp-ps nor "
                   f"dp-worker has")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source_dir", required=True)
    ap.add_argument("--ps", required=True)
    ap.add_argument("--worker", required=True)
    args = ap.parse_args()
    found = problems(args.source_dir,
                     {"dp-ps": args.ps, "dp-worker": args.worker})
    for p in found:
        print(f"FAIL {p}")
    print("OK" if not found else f"{len(found)} flag(s) out of step")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
