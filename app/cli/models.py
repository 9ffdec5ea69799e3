"""`python -m app models ...`: the catalog with fit for this machine, downloads, inspection, pairing."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from app.config import load_settings

if TYPE_CHECKING:
    from app.catalog import curated, gguf
    from app.catalog.library import Library


def add_parser(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="curated pairs, downloads, the local library, pairing verdicts")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    p = msub.add_parser("list", help="the curated pairs with their fit on this machine")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--n-ctx", type=int, default=0, help="context to size for (default: the largest that fits)"
    )

    p = msub.add_parser("pull", help="download a pair (target + drafter + mmproj) or hf:// files as one job")
    p.add_argument("what", nargs="+", help="a pair id from `models list`, or hf://owner/repo/file.gguf ...")
    p.add_argument("--json", action="store_true", help="progress as JSON lines")

    p = msub.add_parser("inspect", help="a GGUF header, local or on the hub (hf://owner/repo/file.gguf)")
    p.add_argument("model", help="a path, a library file name, a packaged key, or hf://...")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = msub.add_parser("pair", help="can DRAFTER draft for TARGET on the token path? rule by rule")
    p.add_argument("target", help="a path, a library file name, a packaged key, or hf://...")
    p.add_argument("drafter", help="same forms as the target")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = msub.add_parser("suggest", help="drafters for any target, from the library and the catalog")
    p.add_argument("target", help="a path, a library file name, a packaged key, or hf://...")
    p.add_argument("--offline", action="store_true", help="check only local files, not the catalog's")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = msub.add_parser("library", help="the GGUF files on this machine")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = msub.add_parser("verify", help="re-hash downloaded files and re-read every header")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = msub.add_parser("import", help="add a GGUF file on disk to the library")
    p.add_argument("path", type=Path)
    p.add_argument(
        "--copy", action="store_true", help="copy it into the models folder (default: use in place)"
    )

    p = msub.add_parser("remove", help="delete a model from the models folder, or forget an imported one")
    p.add_argument("model", help="a path or a library file name")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    p = msub.add_parser("token", help="the Hugging Face token in the OS keyring")
    p.add_argument("action", choices=["set", "clear", "status"], help="set reads the token from stdin")


# --- model references -------------------------------------------------------------------------------


def _library() -> Library:
    from app.catalog.library import Library

    return Library(load_settings().models.folder())


def _catalog() -> list:
    from app.catalog import curated

    path = load_settings().models.catalog
    return curated.load(Path(path).expanduser() if path else None)


def open_header(ref: str, token: str | None = None) -> tuple[gguf.GGUFHeader, str, dict | None]:
    """(header, label, remote read figures or None) for a path, library name, packaged key or hf:// ref."""
    from app.catalog import gguf, remote

    if ref.startswith(remote.SCHEME):
        got = remote.read_remote_header(ref, token)
        stats = {"bytes_read": got.bytes_fetched, "file_size": got.size, "requests": got.requests}
        return got.header, ref, stats
    from app.catalog.packaged import PACKAGED, resolve_model

    if ref in PACKAGED or ref == "default":
        path = resolve_model(ref)
    else:
        path = Path(ref).expanduser()
        if not path.is_file():
            path = _library().resolve(ref)
    return gguf.read_file(path), str(path), None


def _read_share(stats: dict | None) -> str:
    if not stats or not stats.get("file_size"):
        return ""
    share = stats["bytes_read"] / stats["file_size"]
    return (
        f"read {stats['bytes_read'] / 2**20:.1f} MiB of {stats['file_size'] / 2**20:.0f} MiB ({share:.1%}) "
        f"in {stats['requests']} range requests"
    )


def describe(header: gguf.GGUFHeader) -> dict:
    m = header.metadata
    tokens = m.get("tokenizer.ggml.tokens") or []
    template = header.chat_template
    return {
        "architecture": header.architecture,
        "name": header.name,
        "context_length": header.get("{arch}.context_length"),
        "layers": header.get("{arch}.block_count"),
        "embedding_length": header.get("{arch}.embedding_length"),
        "tensors": len(header.tensors),
        "tensor_bytes": header.tensor_bytes,
        "quant_types": header.quant_types(),
        "file_type": m.get("general.file_type"),
        "tokenizer": m.get("tokenizer.ggml.model"),
        "tokenizer_pre": m.get("tokenizer.ggml.pre"),
        "n_tokens": len(tokens),
        "bos": m.get("tokenizer.ggml.bos_token_id"),
        "eos": m.get("tokenizer.ggml.eos_token_id"),
        "add_bos": m.get("tokenizer.ggml.add_bos_token"),
        "chat_template": (template[:200] + ("..." if len(template) > 200 else "")) if template else None,
        "gguf_version": header.version,
    }


# --- commands -------------------------------------------------------------------------------------


def _fit_for_machine(pairs: list[curated.Pair], n_ctx: int) -> dict[str, dict]:
    from app.catalog import fit
    from app.devices import child, placement

    found = child.discover().devices()
    out = {}
    for p in pairs:
        need = p.need()
        placed = placement.place(found, need, placement.UserChoice(n_ctx=n_ctx))
        per_device = []
        for d in found:
            label = "cpu" if not d.is_gpu else f"gpu:{d.index} {d.name}"
            per_device.append(fit.fit_on(need, label, d.free_bytes, placed.n_ctx).summary())
        ctx = f"{placed.n_ctx // 1024}k"
        if placed.device != "cpu":
            badge = f"fits {placed.device} @ {ctx}"
        elif "RAM is short" in placed.reason:
            badge = "too large for this machine"
        else:
            badge = f"CPU only @ {ctx}"
        out[p.id] = {"badge": badge, "placement": placed.as_dict(), "devices": per_device}
    return out


def _installed(pair: curated.Pair, models_dir: Path) -> bool:
    from app.catalog import download

    return all(download.library_path(models_dir, s.repo, s.filename).is_file() for s in pair.file_specs())


def cmd_list(args: argparse.Namespace) -> int:

    pairs = _catalog()
    fits = _fit_for_machine(pairs, args.n_ctx)
    models_dir = load_settings().models.folder()
    rows = []
    for p in pairs:
        rows.append(
            {
                "id": p.id,
                "name": p.name,
                "verified": p.verified,
                "vision": p.vision,
                "license": p.license,
                "download_bytes": p.download_bytes,
                "target": f"{p.target.repo}/{p.target.first}",
                "drafter": f"{p.drafter.repo}/{p.drafter.first}",
                "mmproj": f"{p.mmproj.repo}/{p.mmproj.first}" if p.mmproj else None,
                "installed": _installed(p, models_dir),
                "fit": fits[p.id],
            }
        )
    if args.json:
        print(json.dumps({"pairs": rows}, indent=1))
        return 0
    for r in rows:
        flags = [] if r["verified"] else ["unverified"]
        flags += ["vision"] if r["vision"] else []
        flags += ["installed"] if r["installed"] else []
        extra = f"  [{', '.join(flags)}]" if flags else ""
        size = r["download_bytes"] / 2**30
        print(f"{r['id']:<24} {r['name']:<40} {size:5.1f} GiB  {r['fit']['badge']}{extra}")
        print(f"{'':<24} {r['fit']['placement']['reason']}")
    return 0


def _progress_printer(as_json: bool):
    from app.catalog import download

    last = [0.0]

    def show(p: download.Progress) -> None:
        if as_json:
            print(json.dumps(download.progress_dict(p)), flush=True)
            return
        now = time.monotonic()
        if p.state == "downloading" and now - last[0] < 0.5:
            return
        last[0] = now
        eta = f", {p.eta:.0f} s left" if p.eta is not None else ""
        share = p.done / p.total if p.total else 0.0
        print(
            f"\r{p.state:<11} {p.file[-40:]:<40} {share:6.1%} of {p.total / 2**30:.2f} GiB "
            f"at {p.speed / 2**20:.1f} MiB/s{eta}   ",
            end="" if p.state in ("downloading", "verifying") else "\n",
            file=sys.stderr,
            flush=True,
        )

    return show


def _specs(what: list[str]) -> list:
    from app.catalog import curated, download, remote

    if len(what) == 1 and not what[0].startswith(remote.SCHEME):
        return curated.find(what[0], _catalog()).file_specs()
    specs = []
    for ref in what:
        f = remote.HubFile.parse(ref)
        specs.append(download.FileSpec(f.repo, f.filename, "target" if not specs else "drafter", f.revision))
    return specs


def cmd_pull(args: argparse.Namespace) -> int:
    from app import keystore
    from app.catalog import download

    specs = _specs(args.what)
    job = download.DownloadJob(
        specs, load_settings().models.folder(), keystore.TokenStore().resolve(), _progress_printer(args.json)
    )
    try:
        result = job.run()
    except KeyboardInterrupt:
        job.pause()
        print("\npaused: run the same command to resume", file=sys.stderr)
        return 130
    summary = {
        "paths": [str(p) for p in result.paths],
        "bytes_downloaded": result.bytes_downloaded,
        "bytes_resumed": result.bytes_resumed,
        "refetched": result.refetched,
    }
    if args.json:
        print(json.dumps({"result": summary}), flush=True)
    else:
        for path in result.paths:
            print(path)
        if result.bytes_resumed:
            print(f"resumed: {result.bytes_resumed:,} bytes were already here", file=sys.stderr)
        for what in result.refetched:
            print(f"{what} failed verification and was fetched again", file=sys.stderr)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from app import keystore

    header, label, stats = open_header(args.model, keystore.TokenStore().resolve())
    info = {"model": label, **describe(header), "remote": stats}
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    for key, value in info.items():
        if key == "remote":
            if stats:
                print(f"{'remote':<16} {_read_share(stats)}")
            continue
        print(f"{key:<16} {value}")
    return 0


def cmd_pair(args: argparse.Namespace) -> int:
    from app import keystore
    from app.catalog import pairing

    token = keystore.TokenStore().resolve()
    t, t_label, t_stats = open_header(args.target, token)
    d, d_label, d_stats = open_header(args.drafter, token)
    verdict = pairing.check_pair(t, d, t_label, d_label)
    out = verdict.as_dict() | {"remote": {"target": t_stats, "drafter": d_stats}}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(verdict.summary())
    for r in verdict.rules:
        print(f"  {'pass' if r.passed else 'FAIL'}  {r.name:<22} {r.detail}")
    for label, stats in (("target", t_stats), ("drafter", d_stats)):
        if stats:
            print(f"  {label}: {_read_share(stats)}")
    return 0


def cmd_suggest(args: argparse.Namespace) -> int:
    from app import keystore
    from app.catalog import gguf, pairing, remote

    token = keystore.TokenStore().resolve()
    target, t_label, _ = open_header(args.target, token)
    t_bytes = target.tensor_bytes
    candidates: list[tuple[str, gguf.GGUFHeader | None, str]] = []
    for m in _library().scan():
        if m.problem or m.is_mmproj or str(m.path) == t_label:
            continue
        candidates.append((str(m.path), gguf.read_file(m.path), "library"))
    if not args.offline:
        seen = set()
        for p in _catalog():
            ref = f"hf://{p.drafter.repo}/{p.drafter.first}"
            if ref in seen or p.drafter.size >= t_bytes:
                continue
            seen.add(ref)
            try:
                candidates.append((ref, remote.read_remote_header(ref, token).header, "catalog"))
            except (remote.RemoteError, gguf.GGUFError) as exc:
                candidates.append((ref, None, f"catalog (not checked: {exc})"))
    rows = []
    for ref, header, origin in candidates:
        if header is None:
            rows.append({"drafter": ref, "origin": origin, "compatible": None, "size_ratio": None})
            continue
        if header.tensor_bytes >= t_bytes:
            continue  # a drafter must be smaller than its target
        verdict = pairing.check_pair(target, header, t_label, ref)
        rows.append(
            {
                "drafter": ref,
                "origin": origin,
                "compatible": verdict.compatible,
                "mode": verdict.mode,
                "size_ratio": round(header.tensor_bytes / t_bytes, 3),
                "summary": verdict.summary(),
            }
        )
    # same vocabulary first; among those, a drafter near a tenth of the target's size drafts best per cost
    rows.sort(key=lambda r: (r["compatible"] is not True, abs((r["size_ratio"] or 1) - 0.1)))
    if args.json:
        print(json.dumps({"target": t_label, "suggestions": rows}, indent=1))
        return 0
    if not rows:
        print("no drafter candidates: import or download a smaller model of the same family")
    for r in rows:
        state = {True: "token path", False: "cross-vocab only", None: "not checked"}[r["compatible"]]
        ratio = f"{r['size_ratio']:.1%} of the target" if r["size_ratio"] else ""
        print(f"{state:<17} {r['drafter']}  {ratio}  ({r['origin']})")
    return 0


def cmd_library(args: argparse.Namespace) -> int:
    from app.catalog.library import Library

    settings = load_settings()
    models = Library(settings.models.folder()).scan(include_hf_cache=settings.models.hf_cache)
    if args.json:
        print(
            json.dumps({"models_dir": str(settings.models.folder()), "models": [m.as_dict() for m in models]})
        )
        return 0
    print(f"models folder: {settings.models.folder()}")
    for m in models:
        state = f"  PROBLEM: {m.problem}" if m.problem else ""
        print(f"{m.source:<9} {m.size / 2**30:6.2f} GiB  {m.architecture or '?':<10} {m.path}{state}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    results = _library().verify()
    if not results and not args.json:
        print("no models in the library")
    bad = [(m, why) for m, why in results if not why.startswith("ok")]
    if args.json:
        print(json.dumps({"results": [{"path": str(m.path), "result": why} for m, why in results]}))
    else:
        for m, why in results:
            print(f"{why.split(' ')[0] if why.startswith('ok') else 'BAD':<4} {m.path}: {why}")
    return 1 if bad else 0


def cmd_import(args: argparse.Namespace) -> int:
    model = _library().import_file(args.path, copy=args.copy)
    print(f"imported {model.path} ({model.architecture}, {model.size / 2**30:.2f} GiB)")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    library = _library()
    path = library.resolve(args.model)
    if not args.yes:
        if not sys.stdin.isatty():
            print("refusing to remove without --yes (no terminal to confirm on)", file=sys.stderr)
            return 2
        if input(f"remove {path}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("kept")
            return 1
    print(library.remove(path))
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from app import keystore

    store = keystore.TokenStore()
    if args.action == "set":
        token = getpass.getpass("Hugging Face token: ") if sys.stdin.isatty() else sys.stdin.readline()
        store.set(token)
        print("token stored in the OS keyring")
    elif args.action == "clear":
        print("token removed" if store.delete() else "no token was stored")
    elif why := store.available():
        print(f"no usable keyring on this machine ({why}); HF_TOKEN can hold a token for one session")
    else:
        print("a token is stored in the OS keyring" if store.get() else "no token stored")
    return 0


COMMANDS = {
    "list": cmd_list,
    "pull": cmd_pull,
    "inspect": cmd_inspect,
    "pair": cmd_pair,
    "suggest": cmd_suggest,
    "library": cmd_library,
    "verify": cmd_verify,
    "import": cmd_import,
    "remove": cmd_remove,
    "token": cmd_token,
}


def run(args: argparse.Namespace) -> int:
    from app import keystore
    from app.catalog import curated, download, gguf, remote

    try:
        return COMMANDS[args.models_command](args)
    except (
        download.HubError,
        keystore.KeystoreError,
        remote.RemoteError,
        gguf.GGUFError,
        curated.CatalogError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, FileExistsError, KeyError, ValueError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1
