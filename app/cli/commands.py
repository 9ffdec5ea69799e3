"""The command parser and the commands; `python -m app` and the frozen executable dispatch here."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from app import __version__, paths
from app.config import ConfigError, Settings, add_section_flags, load_settings, overrides_from_args
from app.logs import setup_logging
from app.resources import shipped

log = logging.getLogger("foresight")
COMMANDS = ("gui", "chat", "generate", "bench", "serve", "devices", "models", "rpc-worker")
DEFAULT_PROMPTS = shipped("bench/prompts.json")


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="default", help="target GGUF: a path, 'default' or 'gemma-3-270m'")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--draft", help="drafter GGUF (a path or a packaged model's key)")
    group.add_argument("--ngram", action="store_true", help="draft by n-gram prompt lookup")
    group.add_argument("--no-draft", action="store_true", help="plain decoding only")
    engine_flags = [
        "n_ctx",
        "n_batch",
        "slots",
        "n_threads",
        "device",
        "backend",
        "draft_device",
        "draft_backend",
        "gpu_layers",
        "tensor_split",
        "rpc",
        "device_argmax",
        "flash_attn",
        "mmproj",
    ]
    add_section_flags(p, "engine", engine_flags)
    add_section_flags(p, "draft", ["max_draft", "adaptive", "ngram_min", "ngram_max"])


def _sampling_flags(p: argparse.ArgumentParser) -> None:
    add_section_flags(
        p, "sampling", ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "max_tokens", "seed"]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foresight", description="Fast, private, local AI.")
    parser.add_argument("--version", action="version", version=f"Foresight {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gui = sub.add_parser("gui", help="the desktop window (the default command); model flags go to its engine")
    _model_flags(gui)
    _sampling_flags(gui)
    gui.add_argument(
        "--smoke", action="store_true", help="open the window, get one real answer from its engine, exit 0"
    )

    chat = sub.add_parser("chat", help="chat in the terminal")
    _model_flags(chat)
    _sampling_flags(chat)
    chat.add_argument("--system", default="", help="system prompt")

    gen = sub.add_parser("generate", help="answer one prompt and print the text and speculation stats")
    _model_flags(gen)
    _sampling_flags(gen)
    gen.add_argument("prompt", help="the user message (or raw text with --raw)")
    gen.add_argument("--raw", action="store_true", help="complete the text as is, without the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object")

    bench = sub.add_parser("bench", help="plain vs speculative decoding side by side on a prompt set")
    _model_flags(bench)
    bench.add_argument(
        "--prompts", type=Path, default=DEFAULT_PROMPTS, help="prompt file (bench/prompts.json)"
    )
    bench.add_argument("--tokens", type=int, default=256, help="tokens generated per prompt")
    bench.add_argument("--only", default="", help="comma-separated prompt names or kinds to run")
    bench.add_argument("--json", action="store_true", help="one JSON line per prompt, then a summary")
    bench.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="run each side this many times, alternating, and report each side's median run and spread",
    )
    bench.add_argument(
        "--trace",
        choices=("record", "replay"),
        help="trace: record the drafter's agreement with the target per position (a real pair), or "
        "replay it on this pair: real-size costs, small-pair acceptance",
    )
    bench.add_argument(
        "--trace-file", type=Path, default=None, help="the agreement trace (bench/traces/*.json)"
    )
    bench.add_argument(
        "--shapes", action="store_true", help="only time verify passes by width (steady and alternating)"
    )
    bench.add_argument(
        "--backends",
        default="",
        help="compare backends on the target instead (e.g. llama,native): decode tok/s, verify cost, GB/s",
    )
    bench.add_argument(
        "--concurrency",
        default="",
        help="streams at once, e.g. 1,2,4,8: that many streaming clients against the engine process, "
        "drafting on and off: aggregate tok/s, time to first token and the speculation gain per level",
    )
    bench.add_argument(
        "--url",
        default=None,
        help="with --concurrency: a running engine's address instead of starting one (FORESIGHT_API_KEY, "
        "if set, is sent as its key)",
    )
    bench.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        help="the GPU's memory bandwidth in GB/s for --backends (default: the device's own, from NVML or a "
        "measured copy)",
    )

    serve = sub.add_parser("serve", help="the engine process: an OpenAI-compatible HTTP API (READY port=<n>)")
    _model_flags(serve)
    _sampling_flags(serve)
    add_section_flags(serve, "server", ["host", "port", "queue_size", "per_client", "cors_origin"])
    serve.add_argument(
        "--token-stdin",
        action="store_true",
        help="read the admin token (the GUI's per-launch secret) as one line on stdin; "
        "else FORESIGHT_ADMIN_TOKEN; without one the /admin routes are off",
    )
    serve.add_argument("--engine-child", action="store_true", help=argparse.SUPPRESS)  # the model process
    serve.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="the window that started this engine: the engine stops when that process ends",
    )

    devices = sub.add_parser("devices", help="the devices found, why others were not, and the placement")
    devices.add_argument("--json", action="store_true", help="print one JSON object")
    devices.add_argument("--target", default="default", help="model to place (a path or a packaged key)")
    add_section_flags(devices, "engine", ["rpc"])

    from app.cli import models as models_cli

    models_cli.add_parser(sub)
    from app.cli import rpc_worker

    rpc_worker.add_parser(sub)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides = overrides_from_args(args)
    if getattr(args, "ngram", False):
        overrides.setdefault("draft", {})["mode"] = "ngram"
    elif getattr(args, "no_draft", False):
        overrides.setdefault("draft", {})["mode"] = "none"
    elif getattr(args, "draft", None):
        overrides.setdefault("draft", {})["mode"] = "model"
    return load_settings(overrides=overrides)


def _engine(args: argparse.Namespace):
    from app.catalog.packaged import resolve_model
    from app.devices import placement
    from app.engine.engine import Engine

    target = resolve_model(args.target)
    draft = resolve_model(args.draft) if getattr(args, "draft", None) else None
    settled, placed = placement.settle(_settings(args), target, draft)
    engine = Engine(target, draft, settled)
    engine.placement = placement.describe(placed)
    return engine


def _sampling(settings: Settings):
    from app.engine.sampling import SamplingParams

    return SamplingParams.from_settings(settings.sampling)


_PLACEMENT_KEYS = ("device", "device_reason", "gpu_layers", "n_layer", "main_gpu", "tensor_split", "n_ctx")


def cmd_generate(args: argparse.Namespace) -> int:
    from app.engine.generation import GenerationRequest

    settings = _settings(args)
    with _engine(args) as engine:
        if args.raw:
            prompt = engine.render_text(args.prompt)
        else:
            prompt = engine.render_chat([{"role": "user", "content": args.prompt}])
        request = GenerationRequest(
            prompt=prompt.tokens,
            params=_sampling(settings),
            max_tokens=settings.sampling.max_tokens,
            draft_prompt=prompt.draft_prompt,
        )
        text, stats, finish = [], None, None
        for chunk in engine.generate(request):
            if not args.json:
                print(chunk.text, end="", flush=True)
            text.append(chunk.text)
            stats, finish = chunk.stats or stats, chunk.finish_reason or finish
        result = {"text": "".join(text), "finish_reason": finish, "stats": stats.as_dict() if stats else None}
        props = engine.props()
        result["placement"] = {
            "target": {k: props["target"].get(k) for k in _PLACEMENT_KEYS},
            "draft": {k: props["draft"].get(k) for k in ("source", "device", "gpu_layers", "main_gpu")},
        }
        if args.json:
            print(json.dumps(result))
        else:
            print(f"\n\n[{finish}] " + json.dumps(result["stats"]), file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from app.engine.generation import GenerationRequest

    settings = _settings(args)
    print("Loading the model...", file=sys.stderr)
    with _engine(args) as engine:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        print("Ready. Type a message; an empty line or Ctrl-D quits.", file=sys.stderr)
        while True:
            try:
                line = input("\n> ").strip()
            except (EOFError, KeyboardInterrupt):
                break
            if not line:
                break
            messages.append({"role": "user", "content": line})
            prompt = engine.render_chat(messages)
            request = GenerationRequest(
                prompt=prompt.tokens,
                params=_sampling(settings),
                max_tokens=settings.sampling.max_tokens,
                draft_prompt=prompt.draft_prompt,
            )
            reply, stats = [], None
            try:
                for chunk in engine.generate(request):
                    print(chunk.text, end="", flush=True)
                    reply.append(chunk.text)
                    stats = chunk.stats or stats
            except KeyboardInterrupt:
                print("\n[stopped]")
            messages.append({"role": "assistant", "content": "".join(reply)})
            if stats is not None:
                print(
                    f"\n[{stats.tokens_per_second:.1f} tok/s, {stats.mean_accepted_len:.2f} tokens/pass, "
                    f"{stats.draft_source}]",
                    file=sys.stderr,
                )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from app.cli.bench import load_prompts, run_bench

    if args.repeat < 1:
        raise SystemExit("--repeat: at least 1")
    prompts = load_prompts(args.prompts)
    if args.only:
        wanted = set(args.only.split(","))
        prompts = [p for p in prompts if p["name"] in wanted or p.get("kind") in wanted]
        if not prompts:
            raise SystemExit(f"no prompt in {args.prompts} is named or of kind {args.only!r}")
    if args.concurrency:
        from app.cli import concurrency

        return concurrency.main(args, prompts, _settings(args))
    if args.no_draft and _settings(args).engine.rpc:  # plain decoding here vs over the RPC workers
        from app.catalog.packaged import resolve_model
        from app.cli.rpc_bench import compare as compare_split

        return compare_split(_settings(args), resolve_model(args.target), prompts, args.tokens, args.repeat,
                             args.json)  # fmt: skip
    if args.backends:
        from app.catalog.packaged import resolve_model
        from app.cli.backend_bench import compare

        backends = [b for b in args.backends.split(",") if b]
        if any(b not in ("llama", "native") for b in backends):
            raise SystemExit(f"--backends: llama and/or native, got {args.backends!r}")
        compare(Path(resolve_model(args.target)), backends, args.tokens, args.json, args.bandwidth)
        return 0
    with _engine(args) as engine:
        if args.trace:
            from app.cli import trace

            path = args.trace_file or trace.DEFAULT_TRACE
            if args.trace == "record":
                trace.record(engine, prompts, args.tokens, path)
            else:
                trace.replay(engine, prompts, trace.load_trace(path), args.tokens, args.repeat, args.json)
            return 0
        if args.shapes:
            from app.cli.bench import shape_profile

            for key, ms in shape_profile(engine.target).items():
                print(f"{key:<24} " + " ".join(f"{x:6.2f}" for x in ms), flush=True)
            return 0
        run_bench(engine, prompts, args.tokens, args.json, args.repeat)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from app.server.serve import serve

    return serve(args, _settings(args))


def cmd_devices(args: argparse.Namespace) -> int:
    from app.catalog import fit, gguf
    from app.catalog.packaged import ModelPackageMissing, resolve_model
    from app.devices import child, placement, report

    found = child.discover(rpc_servers=_settings(args).engine.rpc)
    out = {**found.to_json(), "build": found.llama_build(), "fixes": report.gpu_fixes(found)}
    try:
        need = fit.PairNeed(fit.read_shape(resolve_model(args.target)))
        placed = placement.place(found.devices(), need).as_dict()
    except (ModelPackageMissing, FileNotFoundError, gguf.GGUFError) as exc:
        placed = {"error": f"no placement: {exc}"}
    out["placement"] = placed
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(report.report(found))
        print("placement  " + (placed.get("reason") or placed["error"]))
    return 0


def cmd_gui(args: argparse.Namespace) -> int:
    try:
        from app.ui.app import run
    except ImportError as exc:  # PySide6 missing: a source install without the gui extra
        print(
            f"error: the desktop app needs PySide6 ({exc}); install with: pip install -e '.[gui]'",
            file=sys.stderr,
        )
        return 2
    settings = _settings(args)
    sampling = {"temperature": settings.sampling.temperature, "max_tokens": settings.sampling.max_tokens}
    engine_argv = [a for a in args.engine_argv if a != "--smoke"]
    return run(engine_argv, settings.engine.n_ctx, sampling, smoke=args.smoke)


def cmd_models(args: argparse.Namespace) -> int:
    from app.cli import models as models_cli

    return models_cli.run(args)


def cmd_rpc_worker(args: argparse.Namespace) -> int:
    from app.cli import rpc_worker

    return rpc_worker.run(args)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--engine"]:
        # The frozen executable runs its own engine process as `Foresight --engine ...` (= serve).
        argv = ["serve", *argv[1:]]
    if not set(argv) & {*COMMANDS, "-h", "--help", "--version"}:
        argv = ["gui", *argv]
    if argv[:1] != ["gui"]:
        # Every process that may load a model imports llama_cpp before NumPy (a CUDA build was seen to
        # segfault otherwise); the GUI process never loads one, so it never imports llama_cpp.
        import llama_cpp  # noqa: F401
    args = build_parser().parse_args(argv)
    args.engine_argv = argv[1:] if args.command == "gui" else []
    setup_logging(args.log_level, paths.log_dir() / "foresight.log")
    from app.catalog.packaged import ModelPackageMissing
    from app.engine.errors import EngineError

    handlers = {
        "gui": cmd_gui,
        "chat": cmd_chat,
        "generate": cmd_generate,
        "bench": cmd_bench,
        "serve": cmd_serve,
        "devices": cmd_devices,
        "models": cmd_models,
        "rpc-worker": cmd_rpc_worker,
    }
    try:
        return handlers[args.command](args)
    except (EngineError, ModelPackageMissing, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
