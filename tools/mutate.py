#!/usr/bin/env python3
"""A small AST mutation tester (the method of ``shared/test-gaps.md``; mutmut would do the same job).

Mutations: comparison operators (boundary and direction), ``+ - * /`` and ``+=``/``-=``/``*=``/``/=``
swaps, constants (int/float to +1 and to 0, bool negated, strings get an ``XX`` prefix and suffix),
``and``/``or`` swap, ``not`` dropped, ``if`` conditions negated, ``max``/``min`` swap, ``return X`` ->
``return None``, and ``raise``/call statements -> ``pass``. Docstrings and annotations are not mutated
(with ``from __future__ import annotations`` they are never evaluated).

Each mutant is applied alone, in place, in a PRIVATE COPY of the repository (``--tree``, default
``/tmp/mutation-tree``), never in the repository itself. ``--sync`` recreates the copy: by default the
repository's HEAD (``git archive``) plus ``--overlay`` paths from the working tree (default: the module
and ``tests/unit``), or with ``--base worktree`` a snapshot of the whole working tree. pytest runs in the
copy with ``PYTHONPATH`` pointing at it and ``PYTHONDONTWRITEBYTECODE=1``, and the tool first checks that
the module is imported from the copy, not through the editable install in ``.venv`` (which points at the
repository). The mutated file is always restored (``try/finally``); its original is also saved under
``/tmp/mutate-backup/`` and put back at start if a previous run died mid-mutant. One run per copy at a
time (a lock file in the copy). SIGINT/SIGTERM stop the run, restore the file and report what ran.

    python tools/mutate.py --sync --module otel_llm/processor/tail_sampling/policies.py \\
        --tests tests/unit/tail_sampling tests/test_sampling_policies.py --max 60 --seed 1
    python tools/mutate.py --module ... --list            # just list the mutants

A mutant is *killed* when the selection fails (exit status not 0), *timed out* when it exceeds
``--timeout`` (counted as detected); score = (killed + timed out) / run. ``--equivalent FILE`` names
survivors judged equivalent (lines ``<module file name>:<line>: <mutation text>  # reason``) and adds the
score over the non-equivalent mutants.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TREE = Path("/tmp/mutation-tree")
BACKUP_DIR = Path("/tmp/mutate-backup")
# The project's interpreter (its venv has pytest and the dependencies), whichever python runs this tool.
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable

_CMP_SWAPS: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt), ast.GtE: (ast.Gt, ast.LtE),
    ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,), ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,), ast.NotIn: (ast.In,),
}
_BIN_SWAPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                                ast.FloorDiv: ast.Mult}
_OP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
            ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
            ast.Div: "/", ast.FloorDiv: "//", ast.And: "and", ast.Or: "or"}


@dataclass(frozen=True)
class Mutant:
    id: int
    node_index: int  # position of the node in ast.walk order
    line: int
    text: str  # what changes, e.g. "value < 0  ->  value <= 0"
    kind: str
    arg: object = None

    @property
    def key(self) -> str:
        return f"{self.line}: {self.text}"


def _short(node: ast.AST, limit: int = 70) -> str:
    text = ast.unparse(node).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _skipped_nodes(tree: ast.Module) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations and everything under them."""
    skip: set[int] = set()

    def under(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                under(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            under(node.returns)
            for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg,
                      node.args.kwarg):
                if a is not None:
                    under(a.annotation)
        if isinstance(node, ast.AnnAssign):
            under(node.annotation)
    return skip


def enumerate_mutants(source: str) -> list[Mutant]:
    tree = ast.parse(source)
    skip = _skipped_nodes(tree)
    found: list[tuple[int, str, str, object]] = []  # node index, text, kind, arg
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for position, op in enumerate(node.ops):
                for new in _CMP_SWAPS.get(type(op), ()):
                    mutated = copy.deepcopy(node)
                    mutated.ops[position] = new()
                    found.append((index, f"{_short(node)}  ->  {_short(mutated)}", "compare", (position, new)))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAPS:
            new = _BIN_SWAPS[type(node.op)]
            found.append((index, f"{_OP_TEXT[type(node.op)]} -> {_OP_TEXT[new]} in {_short(node)}", "binop", new))
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BIN_SWAPS and type(node.op) is not ast.FloorDiv:
            new = _BIN_SWAPS[type(node.op)]
            found.append((index, f"{_OP_TEXT[type(node.op)]}= -> {_OP_TEXT[new]}= in {_short(node)}", "augassign", new))
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool):
                found.append((index, f"{value!r} -> {(not value)!r}", "const", not value))
            elif isinstance(value, (int, float)):
                for new in dict.fromkeys((value + 1, type(value)(0))):
                    if new != value:
                        found.append((index, f"{value!r} -> {new!r}", "const", new))
            elif isinstance(value, str):
                new = "XX" + value + "XX"
                found.append((index, f"{_short(node, 50)} -> {new[:50]!r}", "const", new))
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            found.append((index, f"{_OP_TEXT[type(node.op)]} -> {_OP_TEXT[new]} in {_short(node)}", "boolop", new))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            found.append((index, f"drop not: {_short(node)}", "not", None))
        elif isinstance(node, (ast.If, ast.IfExp)):
            found.append((index, f"negate condition: {_short(node.test)}", "if", None))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("max", "min"):
            new = "min" if node.func.id == "max" else "max"
            found.append((index, f"{node.func.id} -> {new} in {_short(node)}", "maxmin", new))
        elif isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            found.append((index, f"{_short(node)}  ->  return None", "return", None))
        elif isinstance(node, ast.Raise):
            found.append((index, f"{_short(node)}  ->  pass", "stmt", None))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            found.append((index, f"{_short(node)}  ->  pass", "stmt", None))
    nodes = list(ast.walk(tree))
    # Ids in source order, so that sampling "evenly over the file" means evenly over its lines.
    found.sort(key=lambda f: (getattr(nodes[f[0]], "lineno", 0), getattr(nodes[f[0]], "col_offset", 0), f[0]))
    return [Mutant(i, idx, getattr(nodes[idx], "lineno", 0), text, kind, arg)
            for i, (idx, text, kind, arg) in enumerate(found)]


class _Apply(ast.NodeTransformer):
    def __init__(self, target: ast.AST, mutant: Mutant) -> None:
        self.target, self.mutant = target, mutant

    def visit(self, node: ast.AST) -> ast.AST:  # type: ignore[override]
        if node is not self.target:
            return self.generic_visit(node)
        m = self.mutant
        if m.kind == "compare":
            position, new = m.arg  # type: ignore[misc]
            node.ops[position] = new()
        elif m.kind in ("binop", "augassign", "boolop"):
            node.op = m.arg()  # type: ignore[attr-defined, operator]
        elif m.kind == "const":
            node.value = m.arg  # type: ignore[attr-defined]
        elif m.kind == "not":
            return node.operand  # type: ignore[attr-defined]
        elif m.kind == "if":
            node.test = ast.UnaryOp(ast.Not(), node.test)  # type: ignore[attr-defined]
        elif m.kind == "maxmin":
            node.func = ast.Name(m.arg, ast.Load())  # type: ignore[attr-defined]
        elif m.kind == "return":
            node.value = ast.Constant(None)  # type: ignore[attr-defined]
        elif m.kind == "stmt":
            return ast.Pass()
        return node


def mutated_source(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    target = list(ast.walk(tree))[mutant.node_index]
    tree = _Apply(target, mutant).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def sample(mutants: list[Mutant], max_n: int | None, seed: int) -> list[Mutant]:
    """Evenly over the file (one per stratum of equal size, chosen with the seed), then shuffled."""
    rng = random.Random(seed)
    chosen = list(mutants)
    if max_n is not None and max_n < len(mutants):
        edges = [round(i * len(mutants) / max_n) for i in range(max_n + 1)]
        chosen = [mutants[rng.randrange(a, b)] for a, b in zip(edges, edges[1:]) if b > a]
    rng.shuffle(chosen)
    return chosen


def _backup_path(target: Path) -> Path:
    digest = hashlib.sha1(str(target).encode()).hexdigest()[:12]
    return BACKUP_DIR / f"{digest}-{target.name}.orig"


def sync_tree(tree: Path, overlay: list[str], base: str) -> None:
    """Recreate the copy. ``base="head"``: the repository's HEAD (``git archive``: other engineers'
    unfinished edits stay out) plus the ``overlay`` paths from the working tree (the module under test,
    the new tests). ``base="worktree"``: a snapshot of the whole working tree."""
    if not str(tree).startswith("/tmp/"):
        raise SystemExit(f"--sync only recreates trees under /tmp, not {tree}")
    shutil.rmtree(tree, ignore_errors=True)
    if base == "worktree":
        shutil.copytree(REPO, tree, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", "*.pyc", ".pytest_cache", "mutants", "node_modules"))
        return
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for rel in overlay:
        source, dest = REPO / rel, tree / rel
        if source.is_dir():
            shutil.copytree(source, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif source.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)


def _lock(tree: Path) -> None:
    """One run per copy: two runs mutating one file would restore each other's mutants."""
    tree.mkdir(parents=True, exist_ok=True)
    lock = tree.parent / f".{tree.name}.mutate.lock"  # beside the copy: --sync recreates the copy itself
    try:
        other = int(lock.read_text())
        os.kill(other, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        pass  # no lock, or a stale one
    else:
        if other != os.getpid():
            raise SystemExit(f"{tree} is in use by mutate.py pid {other}")
    lock.write_text(str(os.getpid()))


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_from_tree(tree: Path, module_rel: str) -> None:
    """The tests must import the copy, not the repository the editable install points at."""
    dotted = module_rel.removesuffix(".py").replace("/", ".")
    out = subprocess.run([PYTHON, "-c", f"import {dotted} as m; print(m.__file__)"], cwd=tree,
                         env=_env(tree), capture_output=True, text=True, check=True).stdout.strip()
    if not Path(out).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{dotted} is imported from {out}, not from {tree}: refusing to run")


def run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[str, float, str]:
    cmd = [PYTHON, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - started, ""
    elapsed = time.monotonic() - started
    failed = next((line.split()[1] for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))
                   and len(line.split()) > 1), "")
    return ("survived" if proc.returncode == 0 else "killed"), elapsed, failed


def load_equivalent(path: Path | None, module_name: str) -> dict[str, str]:
    if path is None:
        return {}
    table: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#") or not raw.startswith(module_name + ":"):
            continue
        entry, _, reason = raw[len(module_name) + 1:].partition("  # ")
        table[entry.strip()] = reason.strip()
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", required=True, help="path of the module, relative to the repository")
    parser.add_argument("--tests", nargs="+", default=["tests"], help="pytest selection: test paths or node ids")
    parser.add_argument("--max", type=int, default=None, help="sample at most N mutants, evenly over the file")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per mutant")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", type=int, nargs="+", help="run only these mutant ids")
    parser.add_argument("--tree", type=Path, default=DEFAULT_TREE, help="the private copy the mutants run in")
    parser.add_argument("--sync", action="store_true",
                        help="recreate the copy: the repository's HEAD plus the --overlay paths from the working tree")
    parser.add_argument("--overlay", nargs="*", default=None,
                        help="paths copied from the working tree on --sync (default: the module and tests/unit)")
    parser.add_argument("--base", choices=("head", "worktree"), default="head",
                        help="what --sync copies: HEAD plus --overlay (default), or the whole working tree")
    parser.add_argument("--equivalent", type=Path, help="survivors judged equivalent (see the docstring)")
    args = parser.parse_args(argv)

    module_rel = args.module
    if Path(module_rel).is_absolute():
        module_rel = str(Path(module_rel).resolve().relative_to(REPO))
    source = (REPO / module_rel).read_text()
    mutants = enumerate_mutants(source)
    if args.list:
        for m in mutants:
            print(f"{m.id:4d}  {Path(module_rel).name}:{m.line}: {m.text}")
        print(f"{len(mutants)} mutants")
        return 0

    tree = args.tree.resolve()
    if tree == REPO or tree.is_relative_to(REPO) or REPO.is_relative_to(tree):
        raise SystemExit(f"refusing to mutate inside the repository {REPO}: use a private copy (--tree)")
    _lock(tree)
    target = tree / module_rel
    backup = _backup_path(target)
    if backup.exists():  # a previous run died with a mutant in place
        shutil.copyfile(backup, target)
        print(f"restored {target} from {backup} (a previous run did not finish)")
    if args.sync:
        sync_tree(tree, args.overlay if args.overlay is not None else [module_rel, "tests/unit"], args.base)
    if not target.exists():
        raise SystemExit(f"{target} missing: run with --sync")
    original = target.read_bytes()
    if original.decode() != source:
        print(f"warning: {target} differs from the repository's copy; mutating the tree's version", file=sys.stderr)
        source = original.decode()
        mutants = enumerate_mutants(source)
    check_imports_from_tree(tree, module_rel)
    chosen = mutants if args.only is None else [m for m in mutants if m.id in set(args.only)]
    chosen = sample(chosen, args.max, args.seed)

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    BACKUP_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(target, backup)
    results: list[tuple[Mutant, str, float, str]] = []
    try:
        status, elapsed, failed = run_tests(tree, args.tests, args.timeout * 3)
        if status != "survived":
            raise SystemExit(f"the selection does not pass on the unmutated code ({status}): {' '.join(args.tests)}")
        print(f"baseline passes in {elapsed:.1f} s; {len(chosen)} of {len(mutants)} mutants to run", flush=True)
        for n, m in enumerate(chosen, 1):
            try:
                target.write_text(mutated_source(source, m))
                status, elapsed, failed = run_tests(tree, args.tests, args.timeout)
            finally:
                target.write_bytes(original)
            results.append((m, status, elapsed, failed))
            print(f"[{n}/{len(chosen)}] #{m.id} line {m.line} {status:8s} {elapsed:5.1f}s {failed}  {m.text}",
                  flush=True)
    except KeyboardInterrupt:  # SIGINT, or SIGTERM below: stop, restore, report what ran (a shuffled prefix)
        print(f"interrupted after {len(results)} of {len(chosen)} mutants", flush=True)
    finally:
        target.write_bytes(original)
        backup.unlink(missing_ok=True)

    killed = sum(1 for r in results if r[1] == "killed")
    timed_out = sum(1 for r in results if r[1] == "timeout")
    survivors = sorted((r[0] for r in results if r[1] == "survived"), key=lambda m: (m.line, m.id))
    run = len(results)
    score = 100.0 * (killed + timed_out) / run if run else 0.0
    name = Path(module_rel).name
    print()
    print("| module | generated | sampled | run | killed | survived | timed out | score |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {module_rel} | {len(mutants)} | {len(chosen)} | {run} | {killed} | {len(survivors)} | {timed_out} | "
          f"**{score:.0f} %** |")
    equivalent = load_equivalent(args.equivalent, name)
    judged = [m for m in survivors if m.key in equivalent]
    if args.equivalent is not None:
        rest = run - len(judged)
        adjusted = 100.0 * (killed + timed_out) / rest if rest else 0.0
        print(f"\nnon-equivalent: {rest} run, {len(survivors) - len(judged)} survived, "
              f"{len(judged)} judged equivalent: score **{adjusted:.1f} %**")
    print(f"\nsurvivors ({len(survivors)}):")
    for m in survivors:
        note = f"   [equivalent: {equivalent[m.key]}]" if m.key in equivalent else ""
        print(f"  #{m.id} {name}:{m.key}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
