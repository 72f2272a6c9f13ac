"""A longer fuzzing campaign than CI's: run the property-based tests (tests/test_fuzz.py and the
HTTP fuzzing of tests/test_serve.py) with N examples per property, and record how many cases were
tried and what came of them.

    python benchmarks/fuzz_campaign.py [--examples 1000] [--name fuzz_campaign]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from _common import write_results

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_fuzz.py", "tests/test_serve.py::test_fuzzed_json_gets_only_2xx_or_4xx"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--name", default="fuzz_campaign")
    args = ap.parse_args()
    env = {**os.environ, "SEQREC_FUZZ_EXAMPLES": str(args.examples)}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--no-header",
        "-rA",
        "--hypothesis-show-statistics",
        "--hypothesis-seed=0",
        *TESTS,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    out = proc.stdout + proc.stderr
    # hypothesis' statistics: "- during generate phase (...): N passing examples, M failing ..."
    tried = [int(n) for n in re.findall(r"(\d+) passing examples", out)]
    failing = [int(n) for n in re.findall(r"(\d+) failing examples", out)]
    summary = re.findall(r"^=+ (.*(?:passed|failed).*) =+$", out, re.MULTILINE)
    rows = {
        "properties": len(tried),
        "examples_per_property": args.examples,
        "cases_tried": sum(tried),
        "failing_cases": sum(failing),
        "pytest": summary[-1] if summary else "",
        "exit_code": proc.returncode,
        "seconds": seconds,
    }
    md = (
        "# Fuzzing campaign\n\n"
        f"`SEQREC_FUZZ_EXAMPLES={args.examples}` over {', '.join(TESTS)}.\n\n"
        "| properties | cases tried | failing cases | pytest | seconds |\n|---|---|---|---|---|\n"
        f"| {rows['properties']} | {rows['cases_tried']:,} | {rows['failing_cases']} "
        f"| {rows['pytest']} | {seconds:.0f} |\n"
    )
    write_results(args.name, rows, md, seeds={"hypothesis": 0})
    print(md)
    if proc.returncode:
        print(out[-3000:])
        sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
