"""Tables and verdicts of `bench/results/scale_4gpu.json` (written by `bench/scale_4gpu.py`), for the pages.

Plain Python over the JSON, no heavy imports: the notebook pages import it to render what the GPU runs measured.
The TRL columns (the peer on the same GPUs: `trl_*` keys, `speedup_mean`) appear once any record has a TRL run;
a record without one says "not measured".
"""
from __future__ import annotations
import json, re
from pathlib import Path

TARGETS = {"speedup_split": 1.5, "speedup_colocated": 1.2, "mfu": 0.35, "sync_x_floor": 2.0, "planner_err": 0.10}
"The targets the 4-GPU runs are judged against: mean step time vs TRL, learner MFU per GPU, sync time, planner accuracy."


def records(path:str|Path|list) -> list[dict]:
    "The records of a results file (empty when there is none), or a list of records as they are (every renderer below takes either)."
    if isinstance(path, list): return path
    p = Path(path)
    return json.loads(p.read_text()).get("records", []) if p.exists() else []


def gpus(r:dict) -> str:
    "The GPUs of a record, short: `4× H100` from `4x NVIDIA H100 80GB HBM3`."
    d = (r.get("device") or "?").replace("NVIDIA ", "")
    n, _, name = d.partition("x ") if "x " in d[:4] else ("", "", d)
    return f"{n}× {name.split()[0]}" if n else (name.split() or ["?"])[0]


def name(r:dict) -> str:
    "How the pages name a record: model, layout, what the run changed in the preset (`overrides`), and the GPUs."
    over = f" with {', '.join('--' + o for o in r['overrides'])}" if r.get("overrides") else ""
    return f"{r['model']} {r['layout']}{over} on {gpus(r)}"


def layout_cell(r:dict) -> str:
    "A record's layout for a table cell, with what the run changed in the preset: `colocated --learner.pack_length=49152`."
    return r["layout"] + "".join(f" `--{o}`" for o in r.get("overrides") or [])


def pack_cell(r:dict) -> str:
    "A learner's micro-batches an optimizer step and the pack that makes them: `7 (8192)`; `—` for a record without them."
    return f"{r['micro_batches_per_step']} ({r['pack_length']})" if r.get("micro_batches_per_step") else "—"


def twin(r:dict, main:str|Path) -> dict|None:
    "`main`'s record of the same model, layout and GPUs as `r` (another run of the same work), or None."
    return next((m for m in records(main) if (m["model"], m["layout"], m.get("device")) == (r["model"], r["layout"], r.get("device"))), None)


def paired(path:str|Path, main:str|Path) -> list[dict]:
    """The records of `path` (runs with `--set` overrides), each carrying the TRL run of its `twin` in `main`: the peer's run
    does not depend on what ours changed, so it pairs as it does with the preset's own run."""
    out = []
    for r in records(path):
        t = twin(r, main)
        if r.get("trl_backend") or not (t and t.get("trl_backend")): out.append(r); continue
        x = t["trl_step_mean_s"] / r["step_mean_s"] if t.get("trl_step_mean_s") and r.get("step_mean_s") else None
        out.append({**r, **{k: v for k, v in t.items() if k.startswith("trl_")}, "speedup_mean": x})
    return out


def _packs(r:dict) -> str:
    "A learner's micro-batches a step in words: `7 micro-batches of up to 8,192 tokens`."
    n = r.get("micro_batches_per_step")
    return f"{n} micro-batch{'es' if n != 1 else ''} of up to {r['pack_length']:,} tokens" if n else "micro-batches not recorded"


OVERRIDE_PHASES = (("step", "step_mean_s", "{:.2f}", " s"), ("generation", "time/generation", "{:.2f}", " s"), ("learner", "time/learner", "{:.2f}", " s"),
                   ("MFU", "mfu_per_learner_gpu", "{:.1%}", ""), ("largest GPU peak", "peak_gib_measured", "{:.1f}", " GiB"))
"What `override_lines` compares, and how it prints each: a record key, a phase of `time_split`, or the largest of a per-GPU list."


def override_lines(path:str|Path, main:str|Path) -> list[str]:
    """From each run of `path` to its `twin` in `main`: the learner's share of a step, then what their settings (`overrides`, the
    learner's pack) changed in the step, generation, the learner, its MFU and the largest GPU peak."""
    def get(x, key):
        v = (x.get("time_split") or {}).get(key) if key.startswith("time/") else x.get(key)
        return max(v) if isinstance(v, list) and v else v
    sets = lambda x: " ".join(f"--{o}" for o in x.get("overrides") or []) or "the preset as it is"
    out = []
    for r in records(path):
        base = twin(r, main)
        if base is None: out.append(f"{name(r)}: no run of this model and layout on these GPUs in the main results to compare with"); continue
        w = r.get("work") or {}
        share = (f" ({w['prompts'] * w['G'] // r['learners']} sequences of up to {w['prompt_len'] + w['gen']:,} tokens)"
                 if w and r.get("learners") else "")
        parts = [f"{what} {_f(get(r, key), fmt)} → {_f(get(base, key), fmt)}{unit}" for what, key, fmt, unit in OVERRIDE_PHASES]
        out.append(f"{r['model']} {r['layout']} on {gpus(r)}, a learner's share of a step{share} from {_packs(r)} ({sets(r)}) to "
                   f"{_packs(base)} ({sets(base)}): " + ", ".join(parts) + " (all but the peak: means over the timed steps).")
    return out


def plan_overrides(r:dict) -> list[str]:
    """The `grpo_nb plan` overrides that plan a record's run again: its command's, the model by its built-in shape, and the learner's
    pack the run had (the preset's may have changed since)."""
    over = ["--" + o for o in str(r.get("command", "")).split(" --")[1:]]   # joined with spaces, values unquoted ("--reward.functions={arith: 1.0}")
    return over + [f"--model.name_or_path={r['model']}"] + ([f"--learner.pack_length={r['pack_length']}"] if r.get("pack_length") is not None else [])


def _f(x, fmt="{:.2f}", none="—"):
    return none if x is None else fmt.format(x)


def has_trl(recs:list[dict]) -> bool:
    "Whether any record carries a TRL run (measured or failed)."
    return any(r.get("trl_backend") for r in recs)


def trl_cells(r:dict) -> list[str]:
    "The TRL cells of a record's row: its mode, step mean / median / p90 (s), and TRL's mean over ours."
    if not r.get("trl_backend"): return ["not measured", "—", "—"]
    mode = r["trl_backend"].removeprefix("trl:")
    if r.get("trl_step_mean_s") is None:
        return [mode, "failed: " + _short(r.get("trl_error")), "—"]
    cut = (f" ({r.get('trl_timed_steps')} timed steps; the run stopped)" if r.get("trl_error") and not r.get("trl_complete")
           else " (all steps; its process then outlived the time limit)" if r.get("trl_error")
           else " (all steps; its process then hung and was stopped)" if r.get("trl_note") else "")
    return [mode, f"{_f(r.get('trl_step_mean_s'))} / {_f(r.get('trl_step_median_s'))} / {_f(r.get('trl_step_p90_s'))}{cut}",
            _f(r.get("speedup_mean"), "{:.2f}×")]


def _short(err:str|None, n:int=120) -> str:
    """The line of an error that names it, cut to `n` characters, without table pipes: the `first error:` the benchmark found
    in the processes' log (without its `[rankN]: `), else the last line naming an error."""
    text = err or ""
    if "; first error: " in text:
        first = text.split("; first error: ", 1)[1].splitlines()[0]
        return re.sub(r"^\[rank\d+\]: ", "", first)[:n].replace("|", "/")
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    named = [l for l in lines if "Error" in l or "error" in l] or lines or ["no output"]
    return named[-1][:n].replace("|", "/")


def planner_ratios(r:dict) -> list[float]:
    "Measured / planned peak memory of each GPU of a record."
    return [m / p for m, p in zip(r.get("peak_gib_measured") or [], r.get("peak_gib_planned") or []) if p]


def scale_table(path:str|Path) -> str:
    "Markdown: one row per (model, layout) with step times, MFU, sync against its floor and the exactness of every sync."
    recs = records(path)
    trl = has_trl(recs)
    rows = ["| model | layout | GPUs: learners + engines × TP | learner micro-batches a step (pack tokens) | timed steps | step with its check, mean / median / p90 (s) | MFU per learner GPU | sync (ms) | NCCL floor (ms) | sync ÷ floor | every sync bit-identical | largest log-prob Δ (tolerance) |"
            + (" TRL mode | TRL step mean / median / p90 (s) | TRL ÷ ours (mean) |" if trl else ""),
            "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if trl else "")]
    for r in recs:
        if r.get("smoke"): continue
        eng = f"{gpus(r)}: {r.get('learners')} + {r.get('engines')} × {r.get('tp')}"
        ratio = r["sync_s"] / r["sync_floor_s"] if r.get("sync_s") and r.get("sync_floor_s") else None
        exact = ("yes" if r.get("exact_sync") else "no") + f" ({r.get('syncs_checked', 0)} checks, {r.get('checksums_compared', 0)} tensors)"
        steps = f"{r.get('timed_steps', 0)}" + (" (the run failed)" if r.get("rc") not in (0, None) else "")
        rows.append(f"| {r['model']} | {layout_cell(r)} | {eng} | {pack_cell(r)} | {steps} | {_f(r.get('step_mean_s'))} / {_f(r.get('step_median_s'))} / "
                    f"{_f(r.get('step_p90_s'))} | {_f(r.get('mfu_per_learner_gpu') and 100 * r['mfu_per_learner_gpu'], '{:.1f}%')} | "
                    f"{_f(r.get('sync_s') and 1e3 * r['sync_s'], '{:.0f}')} | {_f(r.get('sync_floor_s') and 1e3 * r['sync_floor_s'], '{:.1f}')} | "
                    f"{_f(ratio, '{:.2f}×')} | {exact} | {_f(r.get('max_abs_logprob_diff'), '{:.3f}')} ({_f(r.get('logprob_atol'), '{:.3f}')}) |"
                    + ("".join(f" {c} |" for c in trl_cells(r)) if trl else ""))
    return "\n".join(rows)


def memory_table(path:str|Path) -> str:
    "Markdown: every GPU's peak memory in use next to `grpo_nb plan`'s prediction."
    recs = records(path)
    trl = has_trl(recs)
    rows = ["| model | layout | GPUs | GPU | measured peak (GiB) | planned (GiB) | measured ÷ planned | planned when it ran (GiB) | measured ÷ that |"
            + (" TRL measured peak (GiB) |" if trl else ""), "|---|---|---|---|---|---|---|---|---|" + ("---|" if trl else "")]
    for r in recs:
        theirs, then = r.get("trl_peak_gib_measured") or [], r.get("peak_gib_planned_at_run") or r.get("peak_gib_planned") or []
        for i, (m, p) in enumerate(zip(r.get("peak_gib_measured") or [], r.get("peak_gib_planned") or [])):
            failed = r.get("trl_error") and r.get("trl_step_mean_s") is None   # a peak of a run that never stepped is not the peer's peak
            t = (" its run failed |" if failed else f" {theirs[i]:.1f} |" if i < len(theirs) else " not measured |") if trl else ""
            was = f" {then[i]:.1f} | {m / then[i]:.2f} |" if i < len(then) and then[i] else " — | — |"
            rows.append(f"| {r['model']} | {layout_cell(r)} | {gpus(r)} | {i} | {m:.1f} | {p:.1f} | {m / p:.2f} |{was}" + t)
    return "\n".join(rows)


def split_table(path:str|Path) -> str:
    "Markdown: where a step's time goes (mean seconds per phase of the timed steps); TRL's run, when there is one, in the row below ours (its learner column: everything but generation and sync)."
    keys = ["time/generation", "time/wait_rollout", "time/learner", "time/sync", "time/sleep", "time/wake", "time/verify"]
    names = {"time/generation": "waiting on generation"}   # one-step-off: the engines generate while the learner steps, so little of it is waited for
    theirs = {"time/generation": "generation", "time/learner": "learner_and_rest", "time/sync": "sync"}   # TRL's phases, as e2e_vs_trl splits them (TRL waits for all of its generation)
    rows = ["| model | layout | GPUs | step (s) | " + " | ".join(f"{names.get(k, k.split('/')[1])} (s)" for k in keys) + " |", "|---" * (len(keys) + 4) + "|"]
    for r in records(path):
        ts = r.get("time_split") or {}
        rows.append(f"| {r['model']} | {layout_cell(r)} | {gpus(r)} | {_f(r.get('step_mean_s'))} | " + " | ".join(_f(ts.get(k)) for k in keys) + " |")
        if r.get("trl_split_s"):
            tr = r["trl_split_s"]
            rows.append(f"| {r['model']} | {r['layout']}: TRL {r['trl_backend'].removeprefix('trl:')} | {gpus(r)} | {_f(r.get('trl_step_mean_s'))} | "
                        + " | ".join(_f(tr.get(theirs[k])) if k in theirs else "—" for k in keys) + " |")
    return "\n".join(rows)


def verdicts(path:str|Path) -> list[str]:
    "One sentence per target: met, missed (by how much) or not measured."
    out = []
    for r in records(path):
        nm = name(r)
        if r.get("rc") not in (0, None):
            errs = [l.strip() for l in (r.get("error") or "").splitlines() if "Error:" in l] or [(r.get("error") or "").strip()[-200:]]
            err = errs[-1] if len(errs[-1]) <= 200 else errs[-1][:200].rsplit(" ", 1)[0] + " …"
            out.append(f"{nm}: the run stopped after {len(r.get('step_s_all') or [])} steps (exit {r['rc']}): {err}"
                       + (f" Why: {r['note']}" if r.get("note") else ""))
        want, got = (r.get("work") or {}).get("prompt_len", 512), r.get("prompt_tokens_mean")
        if got is not None and abs(got - want) > 0.1 * want:
            out.append(f"{nm}: its prompts were {got:.0f} tokens, not the {want} of the work: the benchmark's tokenizer then read a "
                       "prompt word as an unknown token and split words apart; a peer beside it read the same ids, so a comparison holds for this "
                       "shorter work, and the step times are not yet those of the work.")
        out.append(f"{nm}: every sync bit-identical on every TP worker: " + ("yes" if r.get("exact_sync") else "no")
                   + f" ({r.get('syncs_checked', 0)} checks).")
        if r.get("mfu_per_learner_gpu") is not None:
            m = r["mfu_per_learner_gpu"]
            out.append(f"{nm}: learner MFU {100 * m:.1f}% per GPU against the {100 * TARGETS['mfu']:.0f}% target: "
                       + ("met." if m >= TARGETS["mfu"] else "missed."))
        if r.get("sync_s") and r.get("sync_floor_s"):
            x = r["sync_s"] / r["sync_floor_s"]
            out.append(f"{nm}: sync {x:.2f}× the NCCL floor against ≤{TARGETS['sync_x_floor']:.0f}×: " + ("met." if x <= TARGETS["sync_x_floor"] else "missed."))
        rs = planner_ratios(r)
        if rs:
            worst = max(rs, key=lambda q: abs(q - 1))
            out.append(f"{nm}: planner within {100 * TARGETS['planner_err']:.0f}% of every GPU's peak: "
                       + ("met" if abs(worst - 1) <= TARGETS["planner_err"] else "missed") + f" (worst measured ÷ planned {worst:.2f}"
                       + _at_run_note(r) + ").")
        out.append(speedup_verdict(r))
    return out


def _at_run_note(r:dict) -> str:
    "When the plan was recomputed after the run (`--replan`): how the plan the run was given compared."
    then = r.get("peak_gib_planned_at_run")
    if not then or then == r.get("peak_gib_planned"): return ""
    worst = max((m / p for m, p in zip(r.get("peak_gib_measured") or [], then) if p), key=lambda q: abs(q - 1))
    ok = abs(worst - 1) <= TARGETS["planner_err"]
    return f", today's planner; the plan the run was given: worst {worst:.2f}, {'met' if ok else 'missed'}"


def speedup_verdict(r:dict) -> str:
    "One sentence: ours against TRL by mean step time, the target, met or missed; or why there is no number."
    key = "speedup_split" if r["layout"] == "split" else "speedup_colocated"
    head = f"{name(r)}: ≥{TARGETS[key]}× TRL by mean step time: "
    if r.get("speedup_mean"):
        x, mode = r["speedup_mean"], (r.get("trl_backend") or "trl").removeprefix("trl:")
        cut = f"; TRL stopped after {r.get('trl_timed_steps')} timed steps" if r.get("trl_error") and not r.get("trl_complete") else ""
        bare = r.get("step_mean_without_verify_s")
        check = (f" with the bit-exact check after every sync; without it {bare:.2f} s, {r['trl_step_mean_s'] / bare:.2f}×"
                 if bare and bare != r["step_mean_s"] else "")
        return (head + f"{x:.2f}× (TRL {mode} {r['trl_step_mean_s']:.2f} s, ours {r['step_mean_s']:.2f} s{check}{cut}): "
                + ("met." if x >= TARGETS[key] else "missed."))
    if r.get("trl_error"):
        return head + f"not measured: TRL {r['trl_backend'].removeprefix('trl:')} failed ({_short(r['trl_error'], 200)})."
    if r.get("trl_step_mean_s"): return head + f"not measured (TRL {r['trl_backend'].removeprefix('trl:')} ran; our run did not complete)."
    return head + "not measured (no TRL run on these GPUs yet)."


def gap_lines(path:str|Path) -> list[str]:
    "Where the time goes, ours against TRL's, for each record with both: each phase's mean seconds side by side, what TRL has no counterpart for, and how far the step is from the target."
    out = []
    for r in records(path):
        tr, ts = r.get("trl_split_s"), r.get("time_split") or {}
        if not (tr and r.get("step_mean_s") and r.get("trl_step_mean_s")): continue
        g = lambda k: ts.get(k) or 0.0
        key = "speedup_split" if r["layout"] == "split" else "speedup_colocated"
        goal = r["trl_step_mean_s"] / TARGETS[key]
        own = [(n, g(k)) for n, k in (("the bit-exact check", "time/verify"), ("sleep", "time/sleep"), ("wake", "time/wake")) if g(k)]
        rel = f" (of which the learners' cache release {g('time/release'):.2f} s)" if g("time/release") else ""
        if r["layout"] == "split":   # the split preset runs one step off-policy
            eng = f" ({g('time/generation_engine'):.2f} s on the engine)" if g("time/generation_engine") else ""
            head = (f"Generation{eng} runs beside our learner, one step ahead, and the loop waited {g('time/generation') + g('time/wait_rollout'):.2f} s for it, "
                    f"where TRL waited {tr['generation']:.2f} s")
        else:
            head = f"Generation {g('time/generation'):.2f} s against {tr['generation']:.2f} s"
        parts = [head, f"learner {g('time/learner'):.2f} s against TRL's learner and the rest {tr['learner_and_rest']:.2f} s",
                 f"sync {g('time/sync'):.2f} s against {tr['sync']:.2f} s"]
        extra = ", ".join(f"{n} {v:.2f} s" for n, v in own) + rel
        gap = r["step_mean_s"] - goal
        work = g("time/generation") + g("time/learner")   # the phases a step cannot do without, taken in turn when the layout is not split
        bound = ("" if r["layout"] == "split" or gap <= 0 else
                 f" Generation and the learner alone take {work:.2f} s, " + ("more than that: no cut in the overhead reaches the target without a faster learner or engine."
                                                                               if work > goal else "less than that: the overhead is what stands between."))
        out.append(f"{name(r)}: ours {r['step_mean_s']:.2f} s a step, TRL {r['trl_step_mean_s']:.2f} s. " + "; ".join(parts)
                   + (f"; with no counterpart in TRL: {extra}" if extra else "") + ". "
                   + (f"At {TARGETS[key]}× TRL a step would take {goal:.2f} s: {gap:.2f} s less than ours." if gap > 0
                      else f"The {TARGETS[key]}× target ({goal:.2f} s) is met with {-gap:.2f} s to spare.") + bound)
    return out


SHAPES, LAYOUTS = ("Qwen2.5-7B", "OLMo-2-7B"), {"split": "vllm-server", "colocated": "vllm-colocate"}
"The models and layouts the 4-GPU benchmark covers, each layout with the TRL mode run beside it."


def unmeasured(path:str|Path) -> list[str]:
    "What the results do not hold yet: each model and layout without a completed run of ours, and each of ours without a TRL run beside it."
    recs = [r for r in records(path) if not r.get("smoke")]
    out = []
    for m in SHAPES:
        for lay, mode in LAYOUTS.items():
            ours = [r for r in recs if r["model"] == m and r["layout"] == lay and r.get("rc") in (0, None) and r.get("step_mean_s")]
            if not ours: out.append(f"{m} {lay}: not measured yet (neither ours nor TRL {mode})")
            elif any(r.get("trl_step_mean_s") for r in ours): continue
            elif any(r.get("trl_error") for r in ours): out.append(f"{m} {lay}: ours measured; TRL {mode} beside it failed ({_short(next(r['trl_error'] for r in ours if r.get('trl_error')), 200)})")
            else: out.append(f"{m} {lay}: ours measured; TRL {mode} beside it not yet")
    return out


STARTUP_NAMES = {"ray_s": "Ray", "learners_s": "learners", "engines_ready_s": "engines ready", "engine_load_s": "vLLM's load"}
"The start-up phases of a record's `startup_s`, as the pages name them (vLLM's own phases of its load follow as `engine_<phase>`)."


def startup_lines(path:str|Path) -> list[str]:
    "One line per record: the time to the first step and its phases (Ray, the learners, the engines, and vLLM's phases of its load where logged)."
    out = []
    for r in records(path):
        st = r.get("startup_s") or {}
        if not st.get("total_s"): continue
        parts = [f"{phase} {st[k]:.1f} s" for k, phase in STARTUP_NAMES.items() if st.get(k) is not None]
        vllm = [f"{k.removeprefix('engine_').removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in st.items()
                if k.startswith("engine_") and k != "engine_load_s" and v is not None]
        out.append(f"{name(r)}: {st['total_s']:.1f} s to the first step: " + ", ".join(parts)
                   + (f" (vLLM's phases: {', '.join(vllm)})" if vllm else " (vLLM's phases of its load not logged by this run)")
                   + (f"; {r['startup_note']}" if r.get("startup_note") else "") + ".")
    return out
