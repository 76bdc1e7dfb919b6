"""Run the test suite against the INSTALLED cortiq twice: with the ISA the package
detects, then with CORTIQ_ISA=ref (the scalar reference tables).

    python wheels/run_tests.py [TESTS_DIR] [extra pytest args...]

Used by wheels/build_and_test.sh and by cibuildwheel's test-command. Runs pytest from
a temporary directory so the source tree can never shadow the installed package.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
    tests = os.path.abspath(argv[0]) if argv else os.path.join(HERE, "..", "tests")
    extra = argv[1:]
    root = os.path.dirname(tests)
    status = 0
    for label, isa in (("detected ISA", None), ("CORTIQ_ISA=ref", "ref")):
        env = dict(os.environ)
        env.pop("CORTIQ_ISA", None)
        if isa:
            env["CORTIQ_ISA"] = isa
        print(f"=== cortiq tests, {label} ===", flush=True)
        with tempfile.TemporaryDirectory() as cwd:
            cmd = [sys.executable, "-m", "pytest", "-q", "--rootdir", root,
                   "-c", os.path.join(root, "pyproject.toml"), tests, *extra]
            status |= subprocess.call(cmd, env=env, cwd=cwd)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
