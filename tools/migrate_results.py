"""One-off (issue 33 item 2): gather the results records the chapters read into one file per suite per GPU.

    python tools/migrate_results.py            # reads benchmarks/results/*.json, writes <suite>_<gpu>.json there

Each old file ``<name>_<gpu>.json`` (``<gpu>`` = h200 or h100, possibly followed by a suffix such as ``_run1``)
becomes the record ``<name>`` (the suffix kept: ``speculative_run1``) of ``<suite>_<gpu>.json``, unchanged: its
own ``meta`` (GPU, versions, date, command as recorded) and data. Only the files a chapter or test reads are
gathered (listed below, found by grepping chapters/, intro.ipynb, tests/ and minillm/ for ``load_result``); every
other file, and every .txt, stays in git history and under the tag ``archive/kernel-experiments``.
"""
import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"

READ = """
attention_step_host_h200 attention_step_hostdesc_kernels39_h200 autograd_handoff_h200 autograd_handoff_plans_h200
composed_bf16_h100 composed_h200 flash_attention_bwd_h200 flash_attention_bwd_n1k_h200 flash_attention_bwd_sweep_h200
flash_attention_bwd_v5_h200 flash_attention_bwd_versions_h200 flash_attention_causal_order_h200
flash_attention_cold_start_h200 flash_attention_diag_branch128_h200 flash_attention_diag_branch16k_h200
flash_attention_diag_branch2_h200 flash_attention_diag_branch_h200 flash_attention_fwdbwd_d128_h200
flash_attention_grid_kernels16_h200 flash_attention_grid_kernels17_h200 flash_attention_grid_kernels19_h200
flash_attention_grid_kernels24_h200 flash_attention_grid_kernels26_h200 flash_attention_grid_kernels31_h200
flash_attention_h200 flash_attention_hostdesc_default_h200 flash_attention_hostdesc_tiles_h200
flash_attention_hostlse_1024_h200 flash_attention_hostlse_4096_h200 flash_attention_hostplan_1024_h200
flash_attention_hostplan_2048_h200 flash_attention_hostraw_1024_h200 flash_attention_hostraw_2048_h200
flash_attention_hostraw_inference_h200 flash_attention_n1k_fast_h200 flash_attention_n1k_final_h200
flash_attention_n1k_graphs_h200 flash_attention_n1k_kernels10_h200 flash_attention_n1k_kernels16_h200
flash_attention_n1k_kernels37_h200 flash_attention_n1k_kernels41_h200 flash_attention_n1k_kernels53_h200
flash_attention_n1k_kernels9_h200 flash_attention_n1k_launch_h200 flash_attention_n1k_plans2_h200
flash_attention_n1k_plans_h200 flash_attention_n1k_recheck_h200 flash_attention_n1k_recheck_kernels3_h200
flash_attention_ratio_study_kernels51_h200 flash_attention_split_h200 flash_attention_split_study2_h200
flash_attention_split_study_h200 flash_attention_step_study_kernels48_h200 flash_attention_tune_causal128_h200
flash_attention_tune_causal_ws_h200 flash_attention_tune_diag_h200 flash_attention_tune_group2_g256_p1_h200
flash_attention_tune_group2_g256_p2_h200 flash_attention_tune_group2_g512_p1_h200
flash_attention_tune_group2_g512_p2_h200 flash_attention_tune_h200 flash_attention_tune_hostdesc128_h200
flash_attention_tune_hostdesc_narrow_p1_h200 flash_attention_tune_hostdesc_narrow_p2_h200
flash_attention_tune_hostdesc_short_e1_h200 flash_attention_tune_hostdesc_short_e2_h200
flash_attention_tune_hostdesc_tiles_h200 flash_attention_tune_oneloop_branch_h200 flash_attention_tune_oneloop_h200
flash_attention_tune_oneloop_host_h200 flash_attention_tune_split_h200 flash_attention_ws_lse_train_h200
forward_repeats_h200 forward_repeats_lse_h200 graph_capture_h200 graph_capture_kept_h200 hardware_h200
host_breakdown_fast_h200 host_breakdown_h200 host_breakdown_kernels9_h200 host_breakdown_plans2_h200
host_breakdown_plans_h200 launch_overhead_h200 paged_attention_h200 paged_b16_splits_h200
paged_decode_heads_bs16_h200 paged_decode_layout_h200 paged_decode_loops_h200 paged_decode_pieces_h200
paged_decode_pieces_pdl2_h200 paged_decode_study_h200 paged_decode_study_kernels2_h200 paged_decode_tma_b24_bs128_h200
paged_decode_tma_b24_bs64_h200 paged_decode_tma_bs128_h200 paged_decode_tma_bs16_h200 paged_decode_tma_bs64_h200
paged_decode_tma_edges_bs128_h200 paged_decode_tma_edges_bs64_h200 paged_decode_tma_host_bs128_h200
paged_decode_tma_host_bs64_h200 paged_decode_tma_joined_bs16_h200 paged_decode_tma_others_bs128_h200
paged_decode_tma_others_bs64_h200 paged_decode_tma_stages_bs128_h200 paged_decode_tma_stages_bs64_h200
paged_decode_tma_steps_b1_h200 paged_decode_tma_steps_bs16_h200 paged_decode_tma_steps_bs64_h200
paged_decode_v1_deep_h200 paged_decode_v1_sweep_h200 serving_h200 speculative_baselines_h100 speculative_engine_h200
speculative_h200 speculative_h200_run1 ws_lse_h200
""".split()

SUITES = [("hardware", ("hardware", "launch_overhead")),
          ("flash", ("flash_attention", "attention_step", "autograd_handoff", "forward_repeats", "graph_capture",
                     "host_breakdown", "ws_lse")),
          ("paged", ("paged_",)), ("serving", ("serving",)), ("speculative", ("speculative",)),
          ("composed", ("composed",))]


def suite_of(stem: str) -> str:
    return next(s for s, prefixes in SUITES if stem.startswith(prefixes))


def main() -> int:
    files: dict[tuple[str, str], dict] = {}
    for stem in READ:
        m = re.fullmatch(r"(.+?)_(h200|h100)(_.+)?", stem)
        key, gpu = m.group(1) + (m.group(3) or ""), m.group(2)
        doc = json.loads((RESULTS / f"{stem}.json").read_text())
        assert gpu.upper() in doc["meta"]["gpu"], (stem, doc["meta"]["gpu"])
        out = files.setdefault((suite_of(stem), gpu), {"suite": suite_of(stem), "gpu": doc["meta"]["gpu"],
                                                         "records": {}})
        assert doc["meta"]["gpu"] == out["gpu"], stem
        assert key not in out["records"], key
        out["records"][key] = doc
    for (suite, gpu), doc in sorted(files.items()):
        doc["records"] = dict(sorted(doc["records"].items()))
        (RESULTS / f"{suite}_{gpu}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{suite}_{gpu}.json: {len(doc['records'])} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
