"""``python -m sglang.launch_server`` for tests without SGLang or a GPU: takes the flags this project passes to
SGLang 0.5.23 (and refuses any other), records its command line and CUDA_VISIBLE_DEVICES in
``$FAKE_SGLANG_RECORD/<port>.json``, and answers ``/health_generate`` and ``/server_info`` (standard
library only, so it starts fast), and what sglang-router asks of a worker (``/health``, ``/model_info``)."""

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

parser = argparse.ArgumentParser(allow_abbrev=False)
for flag in ("--model-path", "--host", "--port", "--tp-size", "--random-seed", "--mem-fraction-static",
             "--base-gpu-id", "--context-length"):
    parser.add_argument(flag)
for flag in ("--trust-remote-code", "--disable-radix-cache", "--enable-deterministic-inference"):
    parser.add_argument(flag, action="store_true")
args = parser.parse_args()
record = Path(os.environ["FAKE_SGLANG_RECORD"])
record.mkdir(parents=True, exist_ok=True)
(record / f"{args.port}.json").write_text(json.dumps({
    "argv": sys.argv[1:], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}))
INFO = {"context_length": int(args.context_length) if args.context_length else None, "max_req_input_len": 4090,
        "enable_deterministic_inference": args.enable_deterministic_inference}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        model = json.dumps({"model_path": args.model_path, "is_generation": True}).encode()
        # /health and /model_info: what sglang-router asks a worker it is given.
        body = {"/health_generate": b"", "/health": b"", "/server_info": json.dumps(INFO).encode(),
                "/model_info": model, "/get_model_info": model}.get(self.path)
        self.send_response(404 if body is None else 200)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):
        pass


HTTPServer((args.host, int(args.port)), Handler).serve_forever()
