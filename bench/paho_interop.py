#!/usr/bin/env python3
"""The Eclipse paho.mqtt.testing interoperability suites against the embedded broker.

    git clone https://github.com/eclipse/paho.mqtt.testing   (anywhere; used unmodified)
    python3 bench/paho_interop.py --suite PATH/paho.mqtt.testing [--bin target/debug/sitegate]

Starts sitegate with `[mqtt] open_topics = true` (the suites use their own topic names; the
per-organisation rules are tested in tests/it/mqtt.rs) and one MQTT user, then runs
`interoperability/client_test.py` (MQTT 3.1.1) and `client_test5.py` (MQTT 5) against it, each
in its own Python process. The suites connect without credentials and parse their own
arguments before calling unittest; this runner only supplies what they cannot be told on the
command line: it gives every CONNECT the user's credentials, sets the host and port the suites
read, and calls unittest with no arguments of its own. Prints each suite's result and exits
non-zero if a suite could not run. Python standard library only.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Runs inside the suite's process: credentials for every CONNECT, the suite's own main block
# with its argument parsing, and unittest without arguments.
RUNNER = textwrap.dedent("""
    import runpy, sys, unittest
    suite_dir, script, version, host, port, user, password = sys.argv[1:8]
    sys.path.insert(0, suite_dir)
    module = __import__("mqtt.clients." + version, fromlist=["Client"])
    original = module.Client.connect
    def connect(self, *args, **kwargs):
        if not kwargs.get("username"):
            kwargs["username"], kwargs["password"] = user, password.encode()
        return original(self, *args, **kwargs)
    module.Client.connect = connect
    real_main = unittest.main
    unittest.main = lambda *a, **k: real_main(module="__main__", argv=[script], exit=False, verbosity=2)
    sys.argv = [script, "--hostname=" + host, "--port", port]
    runpy.run_path(script, run_name="__main__")
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True, help="a checkout of eclipse/paho.mqtt.testing")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/debug/sitegate"))
    args = ap.parse_args()
    interop = os.path.join(os.path.abspath(args.suite), "interoperability")
    work = tempfile.mkdtemp(prefix="paho-")
    port, http = free_port(), free_port()
    conf = os.path.join(work, "config.toml")
    with open(conf, "w") as f:
        f.write(f'[http]\nlisten = "127.0.0.1:{http}"\n[store]\npath = "{work}/sitegate.db"\n[log]\nlevel = "warn"\n'
                f'[location]\nscan = "off"\n[mqtt]\nlisten = "127.0.0.1:{port}"\nopen_topics = true\n'
                f'[[organizations]]\nid = "acme"\nname = "Acme"\n')
    password = subprocess.run([args.bin, "mqtt-user", "add", "--config", conf, "--org", "acme", "--username", "paho"],
                              capture_output=True, text=True, check=True).stdout.strip()
    server = subprocess.Popen([args.bin, "serve", "--config", conf], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    server.stdout.readline()
    failed_to_run = False
    try:
        for script, version in (("client_test.py", "V311"), ("client_test5.py", "V5")):
            out = subprocess.run([sys.executable, "-c", RUNNER, interop, os.path.join(interop, script), version,
                                  "127.0.0.1", str(port), "paho", password],
                                 cwd=interop, capture_output=True, text=True, timeout=900)
            text = out.stdout + out.stderr
            summary = [l for l in text.splitlines() if l.startswith(("Ran ", "OK", "FAILED"))]
            failures = [l for l in text.splitlines() if l.startswith(("FAIL:", "ERROR:"))]
            print(f"{script}: {' '.join(summary) or 'did not run'}")
            for l in failures:
                print(f"  {l}")
            if os.environ.get("PAHO_VERBOSE"):
                print(text)
            if not summary or "setUpClass" in text:
                failed_to_run = True
                print(text[-3000:])
    finally:
        server.terminate()
        server.wait()
    sys.exit(1 if failed_to_run else 0)


if __name__ == "__main__":
    main()
