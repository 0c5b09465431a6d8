"""The benchmark harness: one command, one suite per chapter's measurements, one results file per suite per GPU.

    python -m benchmarks                       # the suites
    python -m benchmarks SUITE [options]       # run one; SUITE --help lists its options
    python -m benchmarks index [--check]       # rewrite (or check) results/INDEX.md from every record's meta

A run writes one *record* (``{"meta": ..., data}``; meta: GPU, versions, date, command) into
``results/<suite>_<gpu>.json`` (``flash_h200.json``), replacing the record of the same name and keeping the others;
git keeps the one it replaced. ``--record NAME`` names it (default: the suite's own, e.g. ``flash_attention``);
``--out FILE`` writes the record to FILE alone instead (a live run in a chapter, a smoke test on CPU).
Providers, timing and meta live in ``benchmarks/_common.py``; correctness checks are pytest ``gpu`` tests.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

from ._common import REQUIRED_META, RESULTS, gpu_tag, save_record

SUITES = {
    "hardware": "HBM copy bandwidth, bf16 matmul and attention on the roofline; --part launch: the host's share "
                "of a short call (chapters 4, 6)",
    "flash": "minillm's FlashAttention forward and forward+backward against SDPA (FA2, cuDNN, efficient) and "
             "flex_attention (chapters 4, 6)",
    "paged": "the paged decode kernel against SDPA on a contiguous cache of the same data (chapter 7)",
    "serving": "continuous vs static batching, HF generate, the batch-1 roofline, a step profile (chapter 8)",
    "speculative": "speculative decoding in the engine: draft model and prompt lookup, batch 1 to 64 (chapters 9, 10)",
    "composed": "the composed stack, one technique at a time; --study: the bf16 study (chapter 10)",
    "serving_client": "the OpenAI-compatible server under Poisson load at a sweep of rates, measured from the "
                      "client: TTFT, TPOT, ITL, E2E percentiles and goodput (chapter 8)",
    "batch_invariant": "batch-invariant mode: each kernel and the engine with the mode off and on, and the share of "
                       "outputs identical alone and batched (chapter 11)",
}
INDEX = "INDEX.md"


def _usage() -> str:
    width = max(map(len, SUITES))
    return (__doc__.split("\n\n", 1)[1] + "\nsuites:\n"
            + "\n".join(f"  {name:<{width}}  {text}" for name, text in SUITES.items()) + "\n")


def _harness_parser(suite: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {suite}", add_help=False, allow_abbrev=False,
                                description=f"harness options (the suite's own follow): {SUITES[suite]}")
    p.add_argument("--out", help="write the record to this file alone (not into results/)")
    p.add_argument("--record", help="the record's name in results/<suite>_<gpu>.json (default: the suite's)")
    p.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default: benchmarks/results)")
    return p


def record_name(module, argv: list[str]) -> str:
    return module.RECORD(argv) if callable(module.RECORD) else module.RECORD


def run_suite(suite: str, argv: list[str]) -> int:
    harness, rest = _harness_parser(suite).parse_known_args(argv)
    sys.argv[0] = f"python -m benchmarks {suite}"  # the suite's usage line
    module = importlib.import_module(f"benchmarks.{suite}")
    if "-h" in rest or "--help" in rest:
        _harness_parser(suite).print_help()
        print()
    if harness.out:
        return module.main([*rest, "--out", harness.out]) or 0
    name = harness.record or record_name(module, rest)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.json"
        if "--append" in rest:  # add rows to the record already there
            import torch

            path = harness.results / f"{suite}_{gpu_tag(torch.cuda.get_device_name())}.json"
            if path.exists() and name in json.loads(path.read_text())["records"]:
                out.write_text(json.dumps(json.loads(path.read_text())["records"][name]))
        try:
            return module.main([*rest, "--out", str(out)]) or 0
        finally:  # what a run cut short measured is kept too
            if out.exists() and out.stat().st_size:
                record = json.loads(out.read_text())
                if "gpu" in record.get("meta", {}):
                    path = save_record(suite, name, record, harness.results)
                    write_index(harness.results)
                    print(f"wrote record {name!r} into {path}")


# ---- the index: results/INDEX.md, generated from each record's meta ----

def _cell(value) -> str:
    if isinstance(value, dict):
        value = " ; ".join(f"{k}: {v}" for k, v in value.items())
    elif isinstance(value, list):
        value = " ; ".join(map(str, value))
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def index_text(folder: Path = RESULTS) -> str:
    lines = ["# Recorded results", "",
             "Generated by `python -m benchmarks index` from each record's `meta`; do not edit by hand "
             "(a test checks it is current). One file per suite per GPU; `minillm.book.load_result(file, record)` "
             "reads a record.", ""]
    for path in sorted(Path(folder).glob("*.json")):
        doc = json.loads(path.read_text())
        lines += [f"## {path.name}", "", f"Suite `{doc['suite']}` on {doc['gpu']}: {len(doc['records'])} "
                  f"record{'s' if len(doc['records']) != 1 else ''}.", "",
                  "| record | date | GPU | torch | triton | CUDA | command |", "|---|---|---|---|---|---|---|"]
        for name, record in doc["records"].items():
            m = record["meta"]
            lines.append("| " + " | ".join(_cell(v) for v in (
                f"`{name}`", m.get("date"), m.get("gpu"), m.get("torch"), m.get("triton"), m.get("cuda"),
                m.get("command", m.get("commands")))) + " |")
        lines.append("")
    return "\n".join(lines)


def write_index(folder: Path = RESULTS) -> Path:
    path = Path(folder) / INDEX
    path.write_text(index_text(folder))
    return path


def check_results(folder: Path = RESULTS) -> list[str]:
    """What is wrong with the results folder: each file ``<suite>_<gpu>.json`` of a known suite, holding records
    whose meta has the required keys and a command, of the file's GPU."""
    problems = []
    for path in sorted(Path(folder).glob("*.json")):
        doc = json.loads(path.read_text())
        suite, _, tag = path.stem.rpartition("_")
        if suite not in SUITES or set(doc) != {"suite", "gpu", "records"} or doc["suite"] != suite:
            problems.append(f"{path.name}: not a suite's results file ({sorted(doc)})")
            continue
        if gpu_tag(doc["gpu"]) != tag:
            problems.append(f"{path.name}: its GPU is {doc['gpu']}")
        for name, record in doc["records"].items():
            meta = record.get("meta", {})
            missing = [k for k in REQUIRED_META if not meta.get(k)]
            if missing or not (meta.get("command") or meta.get("commands")):
                problems.append(f"{path.name} record {name}: meta lacks {missing or ['command']}")
            elif meta["gpu"] != doc["gpu"]:
                problems.append(f"{path.name} record {name}: recorded on {meta['gpu']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(_usage(), end="")
        return 0
    if argv[0] == "index":
        if "--check" in argv:
            current = (RESULTS / INDEX).exists() and (RESULTS / INDEX).read_text() == index_text()
            problems = check_results() + ([] if current else [f"{INDEX} is stale: python -m benchmarks index"])
            print("\n".join(problems) or "results and index are current")
            return 1 if problems else 0
        print(f"wrote {write_index()}")
        return 0
    if argv[0] not in SUITES:
        print(f"unknown suite {argv[0]!r}\n\n{_usage()}", end="", file=sys.stderr)
        return 2
    return run_suite(argv[0], argv[1:])
