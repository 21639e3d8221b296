"""Stand-in inference server for launcher tests that need no model: answers GET /health.

    python -m tests.launcher.fake_server --port N [--host H] [any SGLang-style flags]

Unknown flags are accepted so the planned server command line can be reused as is.
  FAKE_SERVER_DELAY_S=s        become healthy only after s seconds
  FAKE_SERVER_EXIT=c           exit with code c instead of serving (a server that fails to start)
  FAKE_SERVER_SPAWN_CHILD=1    start a sleeping grandchild (written to $AREAL_RUN_DIR/out)
  FAKE_SERVER_STOP=1           stop itself (SIGSTOP) before it serves (SIGCONT resumes it)
  FAKE_SERVER_WAIT_FILE=path   serve only once that file exists (path may hold $AREAL_RUN_DIR)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        code = 200 if self.path == "/health" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    args, _unknown = p.parse_known_args()
    if os.environ.get("FAKE_SERVER_EXIT"):
        print("fake server failing on purpose", flush=True)
        return int(os.environ["FAKE_SERVER_EXIT"])
    time.sleep(float(os.environ.get("FAKE_SERVER_DELAY_S", "0")))
    wait_file = os.environ.get("FAKE_SERVER_WAIT_FILE")
    if wait_file:
        path = Path(os.path.expandvars(wait_file))
        while not path.exists():  # the test's own deadline (the launcher's startup timeout) bounds it
            time.sleep(0.05)
    if os.environ.get("FAKE_SERVER_STOP"):
        os.kill(os.getpid(), signal.SIGSTOP)
    from tests.launcher.fake_trainer import attach_to_mps

    attach_to_mps()
    info = {
        "pid": os.getpid(),
        "port": args.port,
        "node_tag": os.environ.get("FAKE_NODE_TAG"),
        "ray_node_id": os.environ.get("AREAL_RAY_NODE_ID"),
        "omp": os.environ.get("OMP_NUM_THREADS"),
    }
    if os.environ.get("FAKE_SERVER_SPAWN_CHILD"):
        info["grandchild"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
    run_dir = os.environ.get("AREAL_RUN_DIR")
    if run_dir:
        out = Path(run_dir) / "out"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"server-{args.port}.json").write_text(json.dumps(info))
    server = ThreadingHTTPServer((args.host, args.port), Health)
    print(f"fake server ready on {args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
