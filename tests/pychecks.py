"""pychecks.py - what the Python tests share: counted checks, a summary
line in the suite's form ("name: N passed, N failed") and running the
tool under test."""
import subprocess
import sys

passed = failed = 0


def check(ok, what):
    """Counts one assertion; prints what failed."""
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}")


def run(tool, *args):
    """tool's stdout with python3 and args, checked to exit 0."""
    r = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)
    check(r.returncode == 0, f"{tool} {' '.join(args)} exits 0: {r.stderr}")
    return r.stdout


def done(name):
    """Prints the summary line and exits 1 if anything failed."""
    print(f"{name}: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
