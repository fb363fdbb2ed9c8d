"""``kode bench``: the benchmarks (speculation, quality, latency); see docs/benchmarks.md.

kode bench speculation [--model M] [--tasks N] [--max-tokens N] [--methods a,b] [--seed S]
kode bench quality [--model M ... | --models a,b]
                   [--set both|all|single,multi,span,file,file-lines,js-lines] [--tasks N | --full]
kode bench latency [--model M] [--cadence-ms 120] [--files F ...] [--humaneval N]
kode bench context [--model M] [--holes 24] [--retrieval-tokens 512] [--latency-files 5000]
kode bench names [--model small] [--holes 24] [--windows full,short]
kode bench load (--through-router | --spawn-server | --url URL) [--users 8] [--seconds 20]
kode bench next-edit --repo PATH [PATH ...] [--limit 150] [--seed 0] [--rev HEAD]

Only argument parsing lives here; the benchmark modules are imported when one runs, so
``kode`` itself starts fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _quality_sets(names: tuple[str, ...]) -> tuple[str, ...] | None:
    """``--set`` names expanded (``both``: single and multi; ``all``: every set), or None
    when one is unknown."""
    from kode.bench.quality import ALL_SETS, SETS

    out: list[str] = []
    for name in names:
        if name == "both":
            out.extend(SETS)
        elif name == "all":
            out.extend(ALL_SETS)
        elif name in ALL_SETS:
            out.append(name)
        else:
            return None
    return tuple(dict.fromkeys(out))


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in _csv(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not whole numbers: {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"give numbers >= 0: {text!r}")
    return values


MAX_USERS = 100
MAX_SECONDS = 600.0


def load_arguments(p: argparse.ArgumentParser) -> None:
    """``kode bench load``'s options."""
    p.add_argument("--users", type=int, default=20, help=f"simulated users (1-{MAX_USERS})")
    p.add_argument(
        "--seconds", type=float, default=30.0, help=f"how long they type (1-{MAX_SECONDS:.0f})"
    )
    p.add_argument("--url", help="a running kode serve")
    p.add_argument("--spawn-server", action="store_true", help="start kode serve for the run")
    p.add_argument(
        "--through-router",
        action="store_true",
        help="start kode serve -> SGLang's router -> two kode serve workers for the run "
        "(needs the sglang-router package)",
    )
    p.add_argument("--model", default="small", help="model for --spawn-server")
    p.add_argument(
        "--threads", type=int, default=0, help="llama.cpp threads of each spawned server"
    )
    p.add_argument("--keys-file", type=Path, help="'name:key' lines; users take them in turn")
    p.add_argument("--api-key", default="", help="one key for every user")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--json", action="store_true", help="print the report as JSON only")


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="run a benchmark (see docs/benchmarks.md)")
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    bench.set_defaults(func=run)

    spec = sub.add_parser("speculation", help="speculative decoding vs plain greedy and peers")
    spec.add_argument("--model", default="default", help="default | small | a GGUF path")
    spec.add_argument("--draft-model", default="small", help="draft model for `draft`")
    spec.add_argument("--tasks", type=int, default=4, help="prompts per workload (default 4)")
    spec.add_argument("--max-tokens", type=int, default=64)
    spec.add_argument(
        "--methods",
        type=_csv,
        default=None,
        help="comma list of none,ngram,lookahead,draft,auto,pld,llama-server (default: all)",
    )
    spec.add_argument(
        "--workloads", type=_csv, default=("humaneval", "edit"), help="humaneval,edit"
    )
    spec.add_argument("--seed", type=int, default=0)
    spec.add_argument(
        "--near-tie", type=float, default=1e-3, help="top-2 logit gap below which a flip is a tie"
    )
    spec.add_argument("--threads", type=int, default=None)
    spec.add_argument("--out", type=Path, default=Path("results/speculation"))

    quality = sub.add_parser("quality", help="pass@1 on HumanEval infilling through the engine")
    quality.add_argument(
        "--model",
        action="append",
        default=None,
        help="default | small | a GGUF path; may be given more than once",
    )
    quality.add_argument("--models", type=_csv, default=None, help="comma list, e.g. default,small")
    quality.add_argument(
        "--set",
        type=_csv,
        default=("both",),
        help="comma list of single,multi,span,file,file-lines,js-lines; both = single,multi; "
        "all = every set",
    )
    size = quality.add_mutually_exclusive_group()
    size.add_argument("--tasks", type=int, default=8, help="tasks per set (default 8)")
    size.add_argument("--full", action="store_true", help="every task (hours on a small CPU)")
    quality.add_argument("--max-tokens", type=int, default=None, help="default: the setting")
    quality.add_argument(
        "--modes",
        type=_csv,
        default=("engine", "raw", "llama-server"),
        help="comma list of engine,before,raw,moved,spm,heal,llama-server "
        "(default engine,raw,llama-server)",
    )
    quality.add_argument(
        "--fresh-prefill",
        action="store_true",
        help="every Kode mode evaluates its whole prompt (kvMemoryMb 0, the cache emptied "
        "before each): modes generate alike token for token",
    )
    quality.add_argument("--speculation", default="auto")
    quality.add_argument("--seed", type=int, default=0)
    quality.add_argument("--timeout", type=float, default=10.0, help="seconds per test program")
    quality.add_argument("--out", type=Path, default=Path("results/quality"))
    quality.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a setting for every Kode mode, e.g. suffixTokens=256 (repeatable)",
    )

    latency = sub.add_parser("latency", help="keystroke replay through the LSP server")
    latency.add_argument("--model", default="default")
    latency.add_argument("--cadence-ms", type=float, default=120.0)
    latency.add_argument(
        "--files", type=Path, nargs="*", default=None, help="source files (default: examples/)"
    )
    latency.add_argument("--regions", type=int, default=2, help="regions retyped per file")
    latency.add_argument("--humaneval", type=int, default=2, help="HumanEval tasks to type")
    latency.add_argument("--max-chars", type=int, default=60, help="longest region typed")
    latency.add_argument("--speculation", default=None, help="speculation setting for the server")
    latency.add_argument("--seed", type=int, default=0)
    latency.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a server setting for the replay, e.g. movedSuffixDrift=0 (repeatable)",
    )
    latency.add_argument(
        "--place-pause",
        type=float,
        default=1.0,
        help="seconds between placing the cursor (one answered request) and the first key; "
        "0: type at once into the file just opened (default 1)",
    )
    latency.add_argument(
        "--word-pause",
        type=float,
        default=0.0,
        help="places: ms of pause before each word that follows a separator (a person stops "
        "to read the suggestion); 0: type each line through at --cadence-ms (default 0)",
    )
    latency.add_argument(
        "--scenario",
        choices=["regions", "places", "windows", "typing"],
        default="regions",
        help="regions: retype lines of small files (examples/, HumanEval); places: large real "
        "files (default: argparse.py and tarfile.py of the standard library) as a person "
        "works: open, jump 200+ lines, switch file and back, with and without "
        "kode/didMoveCursor, after --place-pause seconds (use 3); typing: fresh places of "
        "large standard-library files (argparse, imaplib, tarfile, http.client), one cold "
        "request then --keys keys of the real line, per engine and for a generic client",
    )
    latency.add_argument(
        "--engine",
        type=_csv,
        default=None,
        help="places, typing: the engines to run side by side, e.g. inProcess,shared "
        "(default: places the default engine; typing both)",
    )
    latency.add_argument("--places", type=int, default=8, help="typing: places (default 8)")
    latency.add_argument(
        "--debug-log",
        action="store_true",
        help="the server's debug log in OUT/.../lsp.log (kode -vv lsp: sizes, never code)",
    )
    latency.add_argument("--keys", type=int, default=8, help="typing: keys a place (default 8)")
    latency.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=JSON[,KEY=JSON]",
        help="typing, places: one more configuration, Kode's client on the default engine with "
        "these settings, e.g. firstAnswerMs=3000 (repeatable: rules side by side; places: "
        "with kode/didMoveCursor only)",
    )
    latency.add_argument(
        "--open-wait",
        type=float,
        default=0.0,
        help="places: seconds the first file is open, the cursor at the first place, before "
        "its first key (background reading, chunkMemoryMb); default 0",
    )
    latency.add_argument("--rounds", type=int, default=2, help="places: rounds of 4 places")
    latency.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help="a folder given to the server as the workspace (rootUri): project context on",
    )
    latency.add_argument(
        "--lines", type=int, default=20, help="windows: lines cut from the files to complete"
    )
    latency.add_argument(
        "--rate",
        type=float,
        default=95.0,
        help="windows: prompt tokens/s the windows are sized for (95: the 1.5B on 2 cores)",
    )
    latency.add_argument(
        "--horizons",
        type=float,
        nargs="+",
        default=[2.5],
        help="windows: seconds of reading the prepared windows are sized for (default 2.5)",
    )
    latency.add_argument(
        "--no-full",
        action="store_true",
        help="windows: leave out the full window (its figure is known from an earlier run)",
    )
    latency.add_argument(
        "--assembly",
        type=_ints,
        default=None,
        metavar="K[,K...]",
        help="windows: the full window evaluated whole beside it assembled from chunks "
        "evaluated alone, re-evaluating the first K tokens of each (issue #29's guard)",
    )
    latency.add_argument(
        "--chunk-lines",
        type=int,
        default=32,
        help="windows --assembly: lines per chunk; 0: the engine's chunks (content-defined, "
        "read as the background reader reads them)",
    )
    latency.add_argument(
        "--recompute-lines",
        type=int,
        default=0,
        help="windows --assembly: whole lines before the cursor's evaluated as usual",
    )
    latency.add_argument("--out", type=Path, default=Path("results/latency"))

    engine = sub.add_parser(
        "engine", help="one shared engine for 1-3 windows: memory, first answers, keystrokes"
    )
    engine.add_argument("--model", default="default")
    engine.add_argument(
        "--keys", type=int, default=6, help="keystrokes per window, condition and round"
    )
    engine.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of every condition (interleaved); with --busy, of every setting",
    )
    engine.add_argument(
        "--resume", action="store_true", help="add the rounds to those already in OUT"
    )
    engine.add_argument(
        "--in-process",
        action="store_true",
        help="rounds with a model per window (today's separate processes) instead",
    )
    engine.add_argument(
        "--large", type=Path, default=None, help="the busy neighbour's file (default: argparse.py)"
    )
    engine.add_argument(
        "--busy",
        action="store_true",
        help="instead: llama.cpp under one busy process per core (wait policy, threads, nice)",
    )
    engine.add_argument(
        "--lossless",
        type=int,
        default=0,
        metavar="PAIRS",
        help="instead: how often two generations in one batch write other text than alone",
    )
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument("--out", type=Path, default=Path("results/engine"))

    load = sub.add_parser(
        "load", help="simulated users typing against kode serve, or through SGLang's router"
    )
    load_arguments(load)

    context = sub.add_parser("context", help="cross-file holes: project context vs open tabs")
    context.add_argument("--model", default="default")
    context.add_argument("--holes", type=int, default=24)
    context.add_argument("--seed", type=int, default=0)
    context.add_argument("--packages", type=_csv, default=None, help="comma list of packages")
    context.add_argument(
        "--conditions",
        type=_csv,
        default=None,
        help="comma list of in-file,open,retrieval,oracle",
    )
    context.add_argument("--retrieval-tokens", type=int, default=512)
    context.add_argument("--max-tokens", type=int, default=48)
    context.add_argument(
        "--latency-files", type=int, default=0, help="also time the index on N real files"
    )
    context.add_argument("--skip-model", action="store_true", help="only the index timing")
    context.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all)")
    context.add_argument("--prefix-tokens", type=int, default=None)
    context.add_argument(
        "--names-monitor",
        choices=("on", "off"),
        default="on",
        help="the namesMonitor setting (the retrieval condition only)",
    )
    context.add_argument("--out", type=Path, default=Path("results/context"))
    context.add_argument(
        "--resume",
        action="store_true",
        help="keep the results in OUT/partial.jsonl and run only the missing ones",
    )
    context.add_argument(
        "--pool",
        type=lambda v: [Path(p) for p in _csv(v)],
        default=None,
        help="comma list of earlier --out folders: their tables, alone and pooled (no model)",
    )
    context.add_argument(
        "--keystrokes",
        action="store_true",
        help="also retype the holes' lines and count retrieved-snippet changes (no model)",
    )
    context.add_argument(
        "--fitted",
        action="store_true",
        help="also count the holes whose renamed name reaches the fitted retrieved context "
        "(the model's tokenizer only, no completion)",
    )

    names = sub.add_parser(
        "names", help="the first name after receiver., with and without the names monitor"
    )
    names.add_argument("--model", default="small", help="default | small | a GGUF path")
    names.add_argument("--holes", type=int, default=24)
    names.add_argument("--seed", type=int, default=0)
    names.add_argument("--packages", type=_csv, default=None, help="comma list (stdlib)")
    names.add_argument("--windows", type=_csv, default=("full", "short"), help="full,short")
    names.add_argument("--max-tokens", type=int, default=12)
    names.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all)")
    names.add_argument("--out", type=Path, default=Path("results/names"))

    next_edit = sub.add_parser(
        "next-edit", help="next edits replayed from git history (no model), scored"
    )
    next_edit.add_argument(
        "--repo", type=Path, nargs="+", required=True, help="local git repositories"
    )
    next_edit.add_argument("--rev", default="HEAD", help="the commits to sample (git rev-list)")
    next_edit.add_argument("--limit", type=int, default=150, help="cases per class")
    next_edit.add_argument("--seed", type=int, default=0)
    next_edit.add_argument("--max-commits", type=int, default=2000)
    next_edit.add_argument("--max-hunks", type=int, default=12, help="of one file's sequence")
    next_edit.add_argument("--per-commit", type=int, default=4, help="cases of one commit")
    next_edit.add_argument("--out", type=Path, default=Path("results/next-edit"))


def _setting(item: str) -> tuple[str, object]:
    """``KEY=JSON`` (a bare word that is not JSON is taken as a string)."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SystemExit(f"kode bench: --setting wants KEY=VALUE, got {item!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def run(args: argparse.Namespace) -> int:
    if args.bench_command == "speculation":
        from kode.bench import speculation

        return speculation.main(
            speculation.Options(
                model=args.model,
                draft_model=args.draft_model,
                tasks=args.tasks,
                max_tokens=args.max_tokens,
                methods=args.methods or speculation.ALL_METHODS,
                workloads=args.workloads,
                seed=args.seed,
                out=args.out,
                near_tie=args.near_tie,
                threads=args.threads,
            )
        )
    if args.bench_command == "quality":
        from kode.bench import quality

        names = [*(args.model or []), *(args.models or [])] or ["default"]
        unknown = [m for m in args.modes if m not in quality.MODES]
        if unknown:
            known = ", ".join(quality.MODES)
            print(
                f"kode bench quality: unknown mode(s) {', '.join(unknown)}; known: {known}",
                file=sys.stderr,
            )
            return 2
        sets = _quality_sets(args.set)
        if sets is None:
            print(
                f"kode bench quality: unknown set in {','.join(args.set)}; "
                f"known: both, all, {', '.join(quality.ALL_SETS)}",
                file=sys.stderr,
            )
            return 2
        return quality.main(
            quality.Options(
                models=tuple(dict.fromkeys(names)),
                sets=sets,
                tasks=None if args.full else args.tasks,
                max_tokens=args.max_tokens,
                modes=args.modes,
                speculation=args.speculation,
                seed=args.seed,
                timeout_s=args.timeout,
                out=args.out,
                settings=tuple(_setting(item) for item in args.setting),
                fresh_prefill=args.fresh_prefill,
            )
        )
    if args.bench_command == "latency":
        from kode.bench import latency

        options = latency.Options(
            model=args.model,
            cadence_ms=args.cadence_ms,
            files=tuple(args.files) if args.files is not None else None,
            regions=args.regions,
            humaneval=args.humaneval,
            max_chars=args.max_chars,
            speculation=args.speculation,
            seed=args.seed,
            out=args.out,
            place_pause_s=args.place_pause,
            word_pause_ms=args.word_pause,
            settings=tuple(_setting(item) for item in args.setting),
            workspace=args.workspace,
            debug_log=args.debug_log,
        )
        if args.word_pause and args.scenario != "places":
            raise SystemExit("kode bench latency: --word-pause is for --scenario places")
        if args.open_wait and args.scenario != "places":
            raise SystemExit("kode bench latency: --open-wait is for --scenario places")
        if args.assembly is not None and args.scenario != "windows":
            raise SystemExit("kode bench latency: --assembly is for --scenario windows")
        if args.scenario == "places":
            from kode.bench import places

            variants = [tuple(_setting(item) for item in v.split(",")) for v in args.variant]
            return places.main(
                options, args.files, args.rounds, args.engine, variants, args.open_wait
            )
        if args.scenario == "typing":
            from kode.bench import typing_replay as typing_bench

            return typing_bench.main(
                options,
                args.files,
                args.engine or typing_bench.ENGINES,
                args.places,
                args.keys,
                [tuple(_setting(item) for item in v.split(",")) for v in args.variant],
            )
        if args.scenario == "windows":
            from kode.bench import places

            return places.quality_main(
                args.model,
                args.files,
                args.lines,
                args.seed,
                args.rate,
                args.out,
                horizons=tuple(args.horizons),
                full=not args.no_full,
                settings=options.settings,
                assembly=args.assembly,
                chunk_lines=args.chunk_lines,
                recompute_lines=args.recompute_lines,
            )
        return latency.main(options)
    if args.bench_command == "engine":
        from kode.bench import engine as engine_bench

        return engine_bench.main(
            engine_bench.Options(
                model=args.model,
                keys=args.keys,
                rounds=args.rounds,
                large=args.large,
                out=args.out,
                busy=args.busy,
                resume=args.resume,
                in_process=args.in_process,
                seed=args.seed,
                lossless=args.lossless,
            )
        )
    if args.bench_command == "names":
        from kode.bench import names as names_bench

        unknown = [w for w in args.windows if w not in names_bench.WINDOWS]
        if unknown:
            print(f"kode bench names: unknown window(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        return names_bench.main(
            names_bench.Options(
                model=args.model,
                holes=args.holes,
                seed=args.seed,
                packages=args.packages or names_bench.DEFAULT_PACKAGES,
                windows=tuple(args.windows),
                max_tokens=args.max_tokens,
                threads=args.threads,
                out=args.out,
            )
        )
    if args.bench_command == "next-edit":
        from kode.bench import next_edits

        return next_edits.main(
            next_edits.Options(
                repos=tuple(args.repo),
                rev=args.rev,
                limit=args.limit,
                seed=args.seed,
                max_commits=args.max_commits,
                max_hunks=args.max_hunks,
                per_commit=args.per_commit,
                out=args.out,
            )
        )
    if args.bench_command == "load":
        modes = [args.url is not None, args.spawn_server, args.through_router]
        if sum(modes) != 1:
            print(
                "kode bench load: give one of --url, --spawn-server, --through-router",
                file=sys.stderr,
            )
            return 2
        if not 1 <= args.users <= MAX_USERS or not 1 <= args.seconds <= MAX_SECONDS:
            print(
                f"kode bench load: --users must be 1 to {MAX_USERS}, "
                f"--seconds 1 to {MAX_SECONDS:.0f}",
                file=sys.stderr,
            )
            return 2
        from kode.bench import load as load_bench

        return load_bench.run(args)
    if args.bench_command == "context":
        from kode.bench import context

        if args.pool:
            print(context.pool(args.pool))
            return 0
        unknown = [c for c in (args.conditions or ()) if c not in context.CONDITIONS]
        if unknown:
            print(f"kode bench context: unknown condition(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        return context.main(
            context.Options(
                model=args.model,
                holes=args.holes,
                seed=args.seed,
                packages=args.packages or context.DEFAULT_PACKAGES,
                conditions=args.conditions or context.CONDITIONS,
                retrieval_tokens=args.retrieval_tokens,
                max_tokens=args.max_tokens,
                latency_files=args.latency_files,
                skip_model=args.skip_model,
                threads=args.threads,
                prefix_tokens=args.prefix_tokens,
                names_monitor=args.names_monitor == "on",
                out=args.out,
                resume=args.resume,
                keystrokes=args.keystrokes,
                fitted=args.fitted,
            )
        )
    return 2
