"""A stand-in for `python -m sglang.launch_server` in the engine tests.

Reads `--host` and `--port` from its argv, writes {"argv", "pid", "child_pid"} as JSON to the path
in $FAKE_SGLANG_RECORD, starts one child process (to show that stopping the engine ends its whole
process group) and answers GET /health with 200 until terminated.
"""

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Health(BaseHTTPRequestHandler):
    """200 on /health, 404 elsewhere; no request logging."""

    def do_GET(self):  # noqa: N802 - http.server naming
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def main() -> None:
    argv = sys.argv[1:]
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["FAKE_SGLANG_RECORD"], "w", encoding="utf-8") as handle:
        json.dump({"argv": argv, "pid": os.getpid(), "child_pid": child.pid,
                   "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                   "api_key_env": os.environ.get("SLIME_API_KEY")}, handle)
    HTTPServer((host, port), Health).serve_forever()


if __name__ == "__main__":
    main()
