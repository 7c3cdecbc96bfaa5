"""The `zeroboot-kernel` command line."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from .errors import ZerobootError

log = logging.getLogger("zeroboot_kernel")


def _cmd_run(args: argparse.Namespace) -> int:
    from .guest_view import python_spec
    from .runner import interrupt_exit_code, run_from_template, run_to_completion

    extra_view: list[str] = []
    request: dict[str, object] = {}
    if args.c is not None:
        py_args = ["-c", args.c, *args.args]
        request = {"argv": ["-c", *args.args], "code": args.c}
    elif args.m is not None:
        py_args = ["-m", args.m, *args.args]
        request = {"argv": [args.m, *args.args], "module": args.m}
    elif args.args:
        script = os.path.abspath(args.args[0])
        if not os.path.isfile(script):
            print(f"zeroboot-kernel run: {args.args[0]}: no such file", file=sys.stderr)
            return 2
        extra_view.append(script)
        py_args = [script, *args.args[1:]]
        request = {"argv": [script, *args.args[1:]], "path": script}
    else:
        print("zeroboot-kernel run: give -c CODE, -m MODULE or FILE.py", file=sys.stderr)
        return 2
    env = dict(kv.split("=", 1) for kv in args.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        if args.no_template or args.memory != 1024:
            spec = python_spec(py_args, env=env, extra_view=extra_view, mem_bytes=args.memory << 20)
            return run_to_completion(spec, timeout=args.timeout, trace=args.trace_syscalls)
        from .template import Template

        template = Template.ensure(progress=lambda msg: print(f"zeroboot: {msg}", file=sys.stderr, flush=True))
        return run_from_template(template, {**request, "env": env}, extra_view=extra_view,
                                 timeout=args.timeout, trace=args.trace_syscalls)
    except KeyboardInterrupt:
        return interrupt_exit_code()


def _cmd_template(args: argparse.Namespace) -> int:
    from .template import Template, TemplateConfig, default_preload, list_templates, remove_template

    if args.action == "build":
        preload = tuple(p for p in args.preload.split(",") if p) if args.preload is not None else default_preload()
        config = TemplateConfig(args.name, preload, args.memory << 20) if args.memory else \
            TemplateConfig(args.name, preload)
        Template.build(config, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
        return 0
    if args.action == "list":
        rows = list_templates()
        if not rows:
            print("no templates yet: build one with `zeroboot-kernel template build`")
        for t in rows:
            size = f"{t.get('image_bytes_on_disk', 0) >> 20} MiB" if "image_bytes_on_disk" in t else "-"
            print(f"{t['name']:<16} {t['status']:<8} {','.join(t.get('preload', [])) or '-':<28} {size:>9}  "
                  f"{t.get('created', '-')}  {t['directory']}")
        return 0
    removed = remove_template(args.name)
    print("\n".join(f"removed {d}" for d in removed) or f"no template named {args.name!r}")
    return 0 if removed else 1


def _cmd_install(args: argparse.Namespace) -> int:
    from .install import Destination, build_default_template, install_kernelspecs

    dest = Destination.choose(user=args.user, sys_prefix=args.sys_prefix, prefix=args.prefix)
    for path in install_kernelspecs(dest):
        print(f"installed kernelspec {os.path.basename(path)} in {path}")
    if args.no_template:
        print("skipped the template: the first kernel start builds it (a few seconds)")
        return 0
    directory = build_default_template(args.template, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(f"template {args.template!r} ready at {directory}")
    return 0


def _leave_out_iri_grammar() -> None:
    """nbformat imports jsonschema, which imports rfc3987_syntax when it is installed (Jupyter
    Server's jsonschema[format-nongpl] extra brings it), and that module builds a lark grammar as it
    is imported: 1.9 of the 2.2 s `import nbformat` takes here, most of `execute`'s start-up.
    nbformat validates notebooks without format checks (a Draft4Validator without a FormatChecker),
    so the grammar is never used. Only in this command's own process, and only if nothing loaded
    it yet: jsonschema then goes on without its `iri` format checks (its ImportError fallback)."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]


def _cmd_execute(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    _leave_out_iri_grammar()
    from .batch import execute_notebooks, summary_table
    from .notebook_params import parse_cli_value

    parameters = {name: parse_cli_value(value) for name, value in args.parameters}
    # a progress bar on a terminal only (tqdm's disable=None); the engine's lines (a template
    # being built) are written above it
    with tqdm(total=len(args.notebooks), unit="nb", desc="notebooks", disable=None, file=sys.stderr) as bar:
        def done(result: Any) -> None:
            bar.update(1)
            if not result.ok:
                bar.write(f"zeroboot-kernel execute: {result.source}: {result.status}"
                          f"{': ' + result.error if result.error else ''}", file=sys.stderr)

        results = execute_notebooks(args.notebooks, output_dir=args.output_dir, parameters=parameters, jobs=args.jobs,
                                    isolated=args.isolated, timeout=args.timeout, allow_errors=args.allow_errors,
                                    template=args.template, on_result=done,
                                    on_log=lambda text: bar.write(f"zeroboot: {text}", file=sys.stderr),
                                    scheduler=args.scheduler, dask=args.dask, workers_write=args.workers_write)
    print(summary_table(results))
    return 0 if all(r.ok for r in results) else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench.__main__ import main as bench_main

    return bench_main(args.bench_args)


def _cmd_uninstall(args: argparse.Namespace) -> int:
    from .install import Destination, uninstall_kernelspecs

    located = args.user or args.sys_prefix or args.prefix is not None
    dest = Destination.choose(user=args.user, sys_prefix=args.sys_prefix, prefix=args.prefix) if located else None
    removed = uninstall_kernelspecs(dest)
    for path in removed:
        print(f"removed kernelspec {path}")
    if not removed:
        print("no zeroboot kernelspecs found")
    print("templates stay in the cache: `zeroboot-kernel template list` / `template rm NAME` manage them")
    return 0


def _add_location_options(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="your Jupyter data directory")
    where.add_argument("--sys-prefix", action="store_true", help="this Python environment (sys.prefix)")
    where.add_argument("--prefix", metavar="P", default=None, help="P/share/jupyter/kernels")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zeroboot-kernel", description="Python in KVM sandboxes, as a Jupyter kernel.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run this environment's Python in a fresh VM (like `python ...`)")
    run.add_argument("-c", metavar="CODE", help="program passed in as a string")
    run.add_argument("-m", metavar="MODULE", help="run a library module as a script")
    run.add_argument("--trace-syscalls", action="store_true", help="print every guest syscall with its result")
    run.add_argument("--timeout", type=float, default=None, help="stop the guest after this many seconds")
    run.add_argument("--memory", type=int, default=1024, metavar="MIB", help="guest memory (default 1024 MiB)")
    run.add_argument("--env", action="append", default=[], metavar="K=V", help="extra guest environment variable")
    run.add_argument("--no-template", action="store_true",
                     help="boot a fresh interpreter instead of forking the template (slower; what `run` did "
                          "before templates)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="FILE.py and/or arguments for the program")
    run.set_defaults(func=_cmd_run)

    tpl = sub.add_parser("template", help="build, list or remove templates (snapshots forks start from)")
    tsub = tpl.add_subparsers(dest="action", required=True)
    build = tsub.add_parser("build", help="boot the agent, import the preload modules, snapshot it")
    build.add_argument("--name", default="default")
    build.add_argument("--preload", default=None, help="comma-separated modules (default: numpy,pandas,matplotlib "
                                                        "where installed)")
    build.add_argument("--memory", type=int, default=None, metavar="MIB",
                       help="guest memory (default: ZEROBOOT_MEMORY, else the host's RAM up to 4 GiB)")
    tsub.add_parser("list", help="show the templates in the cache and whether they are current")
    rm = tsub.add_parser("rm", help="delete a template")
    rm.add_argument("name")
    tpl.set_defaults(func=_cmd_template)

    inst = sub.add_parser("install", help="install the zeroboot and zeroboot-isolated kernelspecs and build the "
                                          "default template (system-wide unless told otherwise)")
    _add_location_options(inst)
    inst.add_argument("--template", default="default", help="template to build (default: default)")
    inst.add_argument("--no-template", action="store_true", help="do not build the template now")
    inst.set_defaults(func=_cmd_install)
    uninst = sub.add_parser("uninstall", help="remove the zeroboot kernelspecs (from everywhere Jupyter finds them "
                                              "unless a location is given)")
    _add_location_options(uninst)
    uninst.set_defaults(func=_cmd_uninstall)
    ex = sub.add_parser("execute", help="execute notebooks as nbclient/papermill do, each in a sandbox forked from "
                                         "the template (no kernel process per notebook)")
    ex.add_argument("notebooks", nargs="+", metavar="NB.ipynb")
    ex.add_argument("--output-dir", default=None, metavar="DIR",
                    help="write executed notebooks here (default: NAME.executed.ipynb beside each)")
    ex.add_argument("-p", "--parameter", dest="parameters", nargs=2, action="append", default=[],
                    metavar=("NAME", "VALUE"), help="a parameter, injected after the cell tagged `parameters` as "
                                                    "papermill does (VALUE typed as papermill types it)")
    ex.add_argument("--jobs", "-j", type=int, default=1, metavar="N", help="notebooks run at once (default 1)")
    ex.add_argument("--isolated", action="store_true", help="every cell starts from the clean template")
    ex.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds one cell may run")
    ex.add_argument("--allow-errors", action="store_true", help="a cell's error does not stop its notebook")
    ex.add_argument("--template", default="default", help="template to fork from (default: default)")
    where = ex.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                       help="run the notebooks as tasks on this Dask cluster (docs/ARCHITECTURE.md, 'Dask')")
    where.add_argument("--dask", action="store_true",
                       help="run them on a local Dask cluster of --jobs worker processes")
    ex.add_argument("--workers-write", action="store_true",
                    help="with --scheduler/--dask: the workers write into --output-dir, a folder they all share "
                         "(default: the executed notebooks come back here)")
    ex.set_defaults(func=_cmd_execute)
    bench = sub.add_parser("bench", help="run the benchmarks (`bench all [--quick]`, `bench engine`, `bench soak`, "
                                         "...; same as python -m zeroboot_kernel.bench)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, metavar="SECTION [OPTIONS]")
    bench.set_defaults(func=_cmd_bench)
    return p


_RUN_VALUE_OPTIONS = {"--timeout", "--memory", "--env"}


def _split_program_args(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Split `run`'s own options from the program's arguments the way python does: everything after
    -c CODE, -m MODULE or FILE belongs to the program, options included (argparse's REMAINDER
    would take `run -m test -v` as zeroboot-kernel's own -v). Returns (ours, program's) or
    (argv, None) when the command is not `run` (the first word that is not an option: the only
    global option, -v, takes no value)."""
    command = next((i for i, tok in enumerate(argv) if not tok.startswith("-")), None)
    if command is None or argv[command] != "run":
        return argv, None
    i = command + 1
    while i < len(argv):
        tok = argv[i]
        if tok in ("-c", "-m"):
            return argv[:i + 2], argv[i + 2:]
        if tok[:2] in ("-c", "-m") and len(tok) > 2:  # -cCODE, -mMODULE
            return argv[:i + 1], argv[i + 1:]
        if tok == "--":
            return argv[:i], argv[i + 1:]
        if tok in _RUN_VALUE_OPTIONS:
            i += 2
        elif tok.startswith("-"):
            i += 1
        else:
            return argv[:i], argv[i:]  # FILE.py and its arguments
    return argv, []


def main(argv: list[str] | None = None) -> int:
    ours, program = _split_program_args(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(ours)
    if program is not None:
        args.args = program
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="zeroboot: %(message)s")
    try:
        return args.func(args)
    except ZerobootError as exc:
        print(f"zeroboot-kernel: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
