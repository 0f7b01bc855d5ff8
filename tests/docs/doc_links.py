#!/usr/bin/env python3
"""Every relative link of README.md and docs/*.md points at a file of the
repository and, with a #fragment, at a heading of that file (GitHub's
anchors), so that moving text between pages cannot leave a dead link.

Usage: doc_links.py --source_dir DIR
"""

import argparse
import glob
import os
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path):
    """GitHub's anchors of the headings of the Markdown file `path`."""
    found = set()
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            m = None if in_code else re.match(r"#+\s+(.*)", line)
            if m:
                slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
                found.add(slug.replace(" ", "-"))
    return found


def target_problem(source_dir, url):
    """None if `url` (path#anchor, relative to the repository) names a
    heading of a Markdown file there; else what is wrong with it."""
    path, _, fragment = url.partition("#")
    full = os.path.join(source_dir, path)
    if not os.path.isfile(full):
        return f"{path} does not exist"
    if fragment and fragment not in anchors(full):
        return f"{path} has no heading with the anchor #{fragment}"
    return None


def link_problems(source_dir):
    """['page:line: problem'] for every broken relative link."""
    pages = [os.path.join(source_dir, "README.md")] + sorted(
        glob.glob(os.path.join(source_dir, "docs", "*.md")))
    problems = []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            lines = f.readlines()
        for number, line in enumerate(lines, 1):
            for url in LINK.findall(line):
                if re.match(r"[a-z]+:", url):  # https:, mailto:
                    continue
                if url.startswith("#"):
                    url = os.path.basename(page) + url
                rel = os.path.relpath(
                    os.path.join(os.path.dirname(page), url), source_dir)
                problem = target_problem(source_dir, rel)
                if problem:
                    where = os.path.relpath(page, source_dir)
                    problems.append(f"{where}:{number}: ({url}) {problem}")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source_dir", required=True)
    args = ap.parse_args()
    problems = link_problems(args.source_dir)
    for p in problems:
        print(f"FAIL {p}")
    print("OK" if not problems else f"{len(problems)} broken link(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
