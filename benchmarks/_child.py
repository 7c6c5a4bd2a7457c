"""Run a benchmark mode in its own process (so its peak RSS is its own) and read its result.

The child prints one line ``RESULT <json>``; :func:`run_child` returns the decoded dict, or
None after printing the child's stderr when it failed.
"""
import json
import subprocess
import sys


def run_child(script, args, label):
    proc = subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True)
    line = [s for s in proc.stdout.splitlines() if s.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        print(f"{label}: failed\n{proc.stderr[-3000:]}")
        return None
    return json.loads(line[0][len("RESULT "):])
