"""Check with upstream slime's own parsers every flag the TCOD PR's launch script and GPU e2e test hand train.py.

    python tools/slime_pr/check_launch_flags.py PORTED_SLIME_DIR --megatron-dir DIR [--sglang-server-args WHEEL]

Upstream parses with ``parse_known_args``: a misspelt or removed flag is dropped without a word. For each launch (the
script in both TCOD modes, the test in each CI configuration; launch_capture.py records their argument lists) this
reports every ``--flag`` that none of the parsers upstream's ``parse_args`` builds defines (Megatron-LM's, slime's
groups, the ``--sglang-*`` passthrough of SGLang's ``ServerArgs``, the pre-parse flags) and flags given twice; runs
upstream's ``parse_args`` on it, so ``slime_validate_args`` (with the ``--custom-config-path`` YAML) and the Megatron
and SGLang validations run (checkpoints upstream requires to exist are swapped for empty temp dirs); and imports
every dotted plugin path of the parsed arguments with upstream's ``load_function`` (the ``rollout_interaction_env_path``
module must expose ``build_env``). One line per problem, exit 1 on any. No network at run time:

* DIR: Megatron-LM at upstream's ``ARG MEGATRON_COMMIT`` (docker/Dockerfile) with upstream's patch::

      git -C <Megatron-LM git dir> archive 1dcf0dafa884ad52ffb243625717a3471643e087 megatron | tar -x -C DIR
      (cd DIR && git apply -p1 PORTED_SLIME_DIR/docker/patch/latest/megatron.patch)

  It imports on CPU: ``triton`` (and ``six``, ``wandb`` when absent) are stood in for here.
* WHEEL: ``pip download --no-deps sglang==0.5.15.post1`` (the SGLang of upstream's image tag; its
  ``sglang/srt/server_args.py`` is read, never imported), or that file. Without it only ``SGLANG_FALLBACK`` is known.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import os
import re
import sys
import tempfile
import traceback
import types
import warnings
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_capture import DOTTED, E2E_TEST, MUST_EXIST, SCRIPT, SGLANG_FALLBACK, Launch, flags_of  # noqa: E402
from launch_capture import SCRIPT_RUNS, TEST_RUNS, script_launches, test_launches  # noqa: E402, F401 - tests read them


# --------------------------------------------------------------------------- upstream, importable on CPU
class _Anything(types.ModuleType):
    """A module whose every attribute is a decorator-friendly no-op (stands in for triton, wandb)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: a[0] if len(a) == 1 and callable(a[0]) and not k else (lambda f: f)


def _stand_in(name: str, **attrs) -> types.ModuleType:
    module = _Anything(name)
    module.__path__ = []
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _annotated_fields(cls: ast.ClassDef, fields: dict) -> None:
    """``A[T, "help"]`` / ``A[T, Arg(...)]`` fields of ``cls`` into ``fields`` (name -> spec), as sglang's
    ``add_cli_args_from_dataclass`` registers them; a field declared again keeps its first position."""
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        ann = node.annotation
        if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "A"):
            continue
        inner, meta = ann.slice.elts[0], ann.slice.elts[1]
        arg = {k.arg: k.value for k in meta.keywords} if isinstance(meta, ast.Call) else {}
        if isinstance(arg.get("no_cli"), ast.Constant) and arg["no_cli"].value:
            continue
        field_name = node.target.id
        cli = arg["cli_name"].value if "cli_name" in arg else "--" + field_name.replace("_", "-")
        names = [cli] + ([e.value for e in arg["aliases"].elts] if "aliases" in arg else [])
        default = node.value.value if isinstance(node.value, ast.Constant) else None
        if "action" in arg:
            kind = "bool" if "true" in ast.unparse(arg["action"]).lower() else "str"
        else:
            kind = _annotation_kind(inner)
        dest = field_name if field_name != cli.lstrip("-").replace("-", "_") else None
        fields[field_name] = {"names": names, "kind": kind, "default": default, "dest": dest}


def _is_namespace(node) -> bool:
    """A class of ``sglang/srt/arg_groups/fields/`` whose fields ``ServerArgs`` collects (it sets ``_NS_PATH``)."""
    return isinstance(node, ast.ClassDef) and any(
        isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "_NS_PATH" for t in n.targets) for n in node.body
    )


def server_args_specs(source: str, namespace_sources: tuple[str, ...] = ()) -> list[dict]:
    """ServerArgs' CLI arguments read from sglang/srt/server_args.py by AST: [{names, kind, default, dest}].

    Mirrors ``add_cli_args_from_dataclass`` (annotated fields: of ``ServerArgs`` itself and, in releases that
    split them out, of the namespace classes in ``namespace_sources``, sglang/srt/arg_groups/fields/*.py) plus
    the explicit ``parser.add_argument`` calls of ``add_cli_args``; ``kind`` is bool (no value), list (one or
    more) or a scalar type name.
    """
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fields = {}
    _annotated_fields(cls, fields)
    for namespace_source in namespace_sources:
        for node in ast.parse(namespace_source).body:
            if _is_namespace(node):
                _annotated_fields(node, fields)
    specs = list(fields.values())
    add_cli = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    for call in ast.walk(add_cli):
        if not (isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_argument"):
            continue
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
        kw = {k.arg: k.value for k in call.keywords}
        action = ast.unparse(kw["action"]) if "action" in kw else ""
        no_value = "true" in action.lower() or "const" in action.lower() or action == "DeprecatedAction"
        kind = "bool" if no_value else ("list" if "nargs" in kw else ast.unparse(kw.get("type", ast.Name("str"))))
        dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else None
        specs.append({"names": names, "kind": kind, "default": None, "dest": dest})
    return specs


def _annotation_kind(node) -> str:
    text = ast.unparse(node)
    if re.fullmatch(r"(Optional\[)?bool\]?", text):
        return "bool"
    if re.search(r"\b(List|list)\[", text):
        return "list"
    for kind in ("int", "float"):
        if re.fullmatch(rf"(Optional\[)?{kind}\]?", text):
            return kind
    return "str"


def _sglang_stand_in(specs: list[dict]) -> None:
    """``sglang.srt.server_args.ServerArgs`` and ``sglang_router`` stand-ins for upstream's imports."""
    types_ = {"int": int, "float": float}

    def add_cli_args(parser):
        for spec in specs:
            kwargs = {"dest": spec["dest"]} if spec["dest"] else {}
            if spec["kind"] == "bool":
                kwargs.update(action="store_true", default=bool(spec["default"]))
            else:
                kwargs.update(type=types_.get(spec["kind"], str), default=spec["default"])
                if spec["kind"] == "list":
                    kwargs["nargs"] = "+"
            parser.add_argument(*spec["names"], **kwargs)

    server_args = type("ServerArgs", (), {"add_cli_args": staticmethod(add_cli_args)})
    router_args = type("RouterArgs", (), {"add_cli_args": staticmethod(lambda parser, **kwargs: parser)})
    for name in ("sglang", "sglang.srt"):
        _stand_in(name)
    _stand_in("sglang.srt.server_args", ServerArgs=server_args)
    _stand_in("sglang_router")
    _stand_in("sglang_router.launch_router", RouterArgs=router_args)


def read_server_args(path: Path | None) -> list[dict]:
    if path is None:
        return [
            {"names": ["--" + f.replace("_", "-")], "kind": k, "default": d, "dest": None}
            for f, (k, d) in SGLANG_FALLBACK.items()
        ]
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            names = sorted(n for n in wheel.namelist() if re.fullmatch(r"sglang/srt/arg_groups/fields/\w+\.py", n))
            namespaces = tuple(wheel.read(n).decode() for n in names)
            return server_args_specs(wheel.read("sglang/srt/server_args.py").decode(), namespaces)
    fields_dir = path.parent / "arg_groups" / "fields"  # server_args.py inside an unpacked sglang/srt
    namespaces = tuple(p.read_text() for p in sorted(fields_dir.glob("*.py"))) if fields_dir.is_dir() else ()
    return server_args_specs(path.read_text(), namespaces)


def import_upstream(slime_dir: Path, megatron_dir: Path, sglang_specs: list[dict]):
    """Make the ported tree's slime and the pinned Megatron-LM importable here; returns slime.utils.arguments."""
    for name in [m for m in sys.modules if m == "slime" or m.startswith(("slime.", "megatron.", "examples."))]:
        del sys.modules[name]
    for name in ("slime", "megatron", "examples"):
        sys.modules.pop(name, None)
    sys.path[:0] = [str(slime_dir), str(megatron_dir)]
    import torch

    torch.compile(lambda x: x)  # let torch find out it has no triton before the stand-in appears
    _stand_in("triton", __version__="3.4.0", language=_stand_in("triton.language"))
    for name in ("wandb", "six"):  # imported by logging and the BERT tokenizer, never used for parsing
        if importlib.util.find_spec(name) is None:
            _stand_in(name)
    _sglang_stand_in(sglang_specs)
    # Import-time notices (no apex, no deep_ep, ...) say nothing about the flags.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arguments = importlib.import_module("slime.utils.arguments")
            importlib.import_module("slime.backends.megatron_utils.arguments")
    if not arguments.__file__.startswith(str(slime_dir)):
        raise RuntimeError(f"slime was imported from {arguments.__file__}, not from {slime_dir}")
    return arguments


# --------------------------------------------------------------------------- (b), (c), (d)
def known_flags(arguments) -> dict[str, str]:
    """Every option string of the megatron+slime parser and the sglang one -> which defines it."""
    from megatron.training.arguments import add_megatron_arguments

    from slime.backends.sglang_utils.arguments import add_sglang_arguments

    megatron = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(megatron)
    megatron_flags = {o for a in megatron._actions for o in a.option_strings}
    arguments.get_slime_extra_args_provider()(megatron)
    sglang = argparse.ArgumentParser(add_help=False)
    add_sglang_arguments(sglang)
    known = {o: "sglang" for a in sglang._actions for o in a.option_strings}
    known |= {o: "megatron" if o in megatron_flags else "slime" for a in megatron._actions for o in a.option_strings}
    return known


def parse_upstream(arguments, launch: Launch, tmp: Path) -> tuple[argparse.Namespace | None, set[str]]:
    """Upstream's own parse_args on the launch; returns (args or None, option strings of every parser built)."""
    import slime.backends.megatron_utils.arguments as megatron_arguments

    argv = list(launch.argv)
    for i, arg in enumerate(argv[:-1]):
        if arg in MUST_EXIST and not os.path.exists(argv[i + 1]):
            argv[i + 1] = tempfile.mkdtemp(prefix=arg.strip("-") + "_", dir=tmp)
    hf = argv[argv.index("--hf-checkpoint") + 1] if "--hf-checkpoint" in argv[:-1] else None
    skip_hf = hf is None or not Path(hf, "config.json").exists()  # the model config check needs the model
    seen_parsers = set()
    parse_known = argparse.ArgumentParser.parse_known_args

    def recording_parse_known(self, *a, **k):
        seen_parsers.update(o for action in self._actions for o in action.option_strings)
        return parse_known(self, *a, **k)

    real_megatron_parse = megatron_arguments.megatron_parse_args
    megatron_training_arguments = importlib.import_module("megatron.training.arguments")
    real_arch = megatron_training_arguments.get_device_arch_version
    old_argv, old_cwd, old_env = sys.argv, os.getcwd(), dict(os.environ)
    out = io.StringIO()
    try:
        sys.argv = ["train.py", *argv]
        os.chdir(launch.cwd)
        os.environ.update(launch.env)
        argparse.ArgumentParser.parse_known_args = recording_parse_known
        # Megatron asks the GPU's architecture when TP or CP > 1; answer Hopper, upstream's CI fleet.
        megatron_training_arguments.get_device_arch_version = lambda: 9
        megatron_arguments.megatron_parse_args = lambda extra_args_provider, skip_hf_validate=False: (
            real_megatron_parse(extra_args_provider, skip_hf_validate=skip_hf_validate or skip_hf)
        )
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            return arguments.parse_args(), seen_parsers
    except SystemExit:
        launch.problems.append(f"upstream's argparse refused the arguments: {out.getvalue().strip()[-400:]}")
    except Exception as err:  # any validation failure is the finding
        frames = traceback.extract_tb(err.__traceback__)
        where = next((f for f in reversed(frames) if "site-packages" not in f.filename), frames[-1])
        launch.problems.append(
            f"upstream's parse_args/validation failed: {type(err).__name__}: {err} "
            f"({Path(where.filename).name}:{where.lineno})"
        )
    finally:
        argparse.ArgumentParser.parse_known_args = parse_known
        megatron_arguments.megatron_parse_args = real_megatron_parse
        megatron_training_arguments.get_device_arch_version = real_arch
        sys.argv = old_argv
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
    return None, seen_parsers


def plugin_problems(args: argparse.Namespace) -> list[str]:
    from slime.utils.misc import load_function

    problems = []
    for dest, value in sorted(vars(args).items()):
        # Upstream's plugin flags are --custom-*-path, --*-function-path and the rollout hooks; other
        # *_path flags are files (e.g. --memory-snapshot-path snapshot.pickle).
        plugin = dest.startswith("custom_") or "function" in dest or dest.startswith(("rollout_", "buffer_"))
        if not (plugin and dest.endswith("_path") and isinstance(value, str) and DOTTED.match(value)):
            continue
        try:
            if dest == "rollout_interaction_env_path":
                if not callable(getattr(importlib.import_module(value), "build_env", None)):
                    problems.append(f"{dest}={value}: the module has no build_env(sample, args)")
            elif not callable(load_function(value)):
                problems.append(f"{dest}={value}: not callable")
        except Exception as err:
            problems.append(f"{dest}={value} does not import: {type(err).__name__}: {err}")
    return problems


def teacher_problems(teacher_argv: list[str], sglang_specs: list[dict]) -> list[str]:
    """The teacher's ``sglang.launch_server`` flags must be ServerArgs' own names, not abbreviations."""
    names = {n for spec in sglang_specs for n in spec["names"]}
    problems = []
    for flag in dict.fromkeys(flags_of(teacher_argv)):
        if flag not in names:
            longer = sorted(n for n in names if n.startswith(flag))
            hint = f" (argparse would take it as an abbreviation of {longer[0]})" if len(longer) == 1 else ""
            problems.append(f"teacher server flag {flag} is not a ServerArgs flag{hint}")
    return problems


def yaml_problems(args: argparse.Namespace, flags: list[str]) -> list[str]:
    """A --custom-config-path key that is also given on the command line: the YAML wins, silently."""
    import yaml

    if not getattr(args, "custom_config_path", None):
        return []
    with open(args.custom_config_path) as f:
        keys = list(yaml.safe_load(f) or {})
    return [
        f"{k}: set both by {flag} and by the YAML (upstream keeps the YAML's)"
        for k in keys
        if (flag := "--" + k.replace("_", "-")) in flags
    ]


def check(launch: Launch, arguments, known: dict[str, str], tmp: Path) -> dict[str, int]:
    """Fill launch.problems; returns how many of its flags each parser defines."""
    args, built = parse_upstream(arguments, launch, tmp)
    flags, counts = flags_of(launch.argv), {}
    for flag in dict.fromkeys(flags):
        source = known.get(flag) or ("pre-parse" if flag in built else None)
        if source is None:
            launch.problems.append(f"{flag}: no upstream parser defines it (upstream would drop it silently)")
        else:
            counts[source] = counts.get(source, 0) + 1
        if flags.count(flag) > 1:
            launch.problems.append(f"{flag}: given {flags.count(flag)} times (the last one wins)")
    if args is not None:
        launch.problems += plugin_problems(args) + yaml_problems(args, flags)
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slime_dir", type=Path, help="upstream slime tree after tools/slime_pr/port.py")
    parser.add_argument("--megatron-dir", type=Path, required=True, help="Megatron-LM at MEGATRON_COMMIT, patched")
    parser.add_argument("--sglang-server-args", type=Path, default=None, help="sglang wheel or server_args.py")
    opts = parser.parse_args(argv)
    slime_dir, megatron_dir = opts.slime_dir.resolve(), opts.megatron_dir.resolve()
    for path in (slime_dir / SCRIPT, slime_dir / E2E_TEST, megatron_dir / "megatron" / "training" / "arguments.py"):
        if not path.exists():
            print(f"missing: {path}")
            return 1
    if opts.sglang_server_args is None:
        print(f"note: no --sglang-server-args; only these --sglang-* fields are known: {sorted(SGLANG_FALLBACK)}")

    sglang_specs = read_server_args(opts.sglang_server_args)
    n_problems = 0
    with tempfile.TemporaryDirectory() as tmp:
        launches = script_launches(slime_dir, Path(tmp))  # before the import: it runs bash only
        arguments = import_upstream(slime_dir, megatron_dir, sglang_specs)
        launches += test_launches(slime_dir, Path(tmp))
        known = known_flags(arguments)
        for launch in launches:
            counts = check(launch, arguments, known, Path(tmp)) if launch.argv else {}
            if launch.teacher_argv is not None and opts.sglang_server_args is not None:
                launch.problems += teacher_problems(launch.teacher_argv, sglang_specs)
            summary = ", ".join(f"{n} {source}" for source, n in sorted(counts.items()))
            teacher = f", teacher server {len(flags_of(launch.teacher_argv))} flags" if launch.teacher_argv else ""
            print(f"{launch.name}: {len(set(flags_of(launch.argv)))} train.py flags ({summary}){teacher}")
            for problem in launch.problems:
                print(f"  PROBLEM {launch.name}: {problem}")
            n_problems += len(launch.problems)
    print(f"{len(launches)} launches, {n_problems} problems")
    return 1 if n_problems else 0


if __name__ == "__main__":
    sys.exit(main())
