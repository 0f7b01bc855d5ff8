#!/usr/bin/env python3
"""python_readme: the README's "Train a PyTorch model" commands, run as
written (bash, from the source tree): dp-ps saves the CNN's model and rank
0 reports its test accuracy.

Usage: readme_test.py --ps BIN --worker BIN --source_dir DIR
"""

import os
import re
import subprocess
import sys

import harness

SECTION = "## Train a PyTorch model"


def commands(readme):
    """The first ```bash block of the section."""
    text = open(readme).read()
    body = text[text.index(SECTION):]
    m = re.search(r"```bash\n(.*?)```", body, re.S)
    return m.group(1)


def main():
    a = harness.args()
    checks = harness.Checks()
    script = commands(os.path.join(a.source_dir, "README.md"))
    saved = re.search(r"--save_model=(\S+)", script).group(1)
    if os.path.exists(saved):
        os.remove(saved)
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=a.source_dir,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    out = run.stdout
    if not checks.check(run.returncode == 0, f"the commands exit 0 (got {run.returncode})"):
        print(out[-4000:])
    checks.check(os.path.exists(saved), f"dp-ps saved the model to {saved}")
    m = re.search(r"test accuracy (0\.\d+)", out)
    checks.check(m is not None and float(m.group(1)) > 0.5,
                 f"rank 0 reports a test accuracy above 0.5 ({m.group(1) if m else None})")
    return checks.result()


if __name__ == "__main__":
    sys.exit(main())
