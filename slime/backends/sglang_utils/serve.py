"""Serve one engine in the foreground, the way train.py would start it (for shell scripts: a teacher server).

    python -m slime.backends.sglang_utils.serve --rollout-backend sglang --sglang-python PY \\
        --hf-checkpoint DIR --port P [--seed S] [--sglang-enable-deterministic-inference] [other train.py flags]

The command is train.py's for its own engines (``launcher.build_engine_command``: SGLang's CPU settings where there
is no CUDA device, the same flags), so a script's teacher and train.py's students are served alike. This process
becomes the server (exec): the pid a shell's ``$!`` holds is the server's, and an SGLang server watches the
shell (``--parent-pid``, default: this process's parent) and dies with it.
"""

from __future__ import annotations

import os
import sys


def main(argv=None) -> int:
    from slime.backends.sglang_utils.launcher import build_engine_command, engine_env
    from slime.utils.arguments import get_parser

    parser = get_parser()
    parser.add_argument("--port", type=int, required=True, help="port to serve on")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="the server exits once this process is gone (default: the caller of this command)")
    args = parser.parse_args(argv)
    if not args.hf_checkpoint:
        parser.error("--hf-checkpoint is required: the model to serve")
    cmd = build_engine_command(args, model_path=args.hf_checkpoint, host=args.engine_host, port=args.port)
    parent = args.parent_pid or os.getppid()
    if parent == 1:  # started by a process that is gone already: nothing to die with
        parser.error("this command's parent is gone (pid 1): start it from the script it serves, or pass --parent-pid")
    if "--parent-pid" in cmd:  # the hf_engine's own watchdog
        cmd[cmd.index("--parent-pid") + 1] = str(parent)
    env = dict(os.environ, **(engine_env(cmd) or {}))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    print(" ".join(cmd), file=sys.stderr, flush=True)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as err:
        print(f"serve: could not run {cmd[0]} ({err}); is --sglang-python a Python interpreter?", file=sys.stderr)
        return 2
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
