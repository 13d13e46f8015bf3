"""The engine's own CPU per step, in one process: what a step costs the worker's Python, without the fleet's noise.

    python3.11 deploy/dev.py bench --step-cpu [--steps 1000] [--repeat 3] [--against DIR]

A demo_steps task (one effect per step) is driven to completion in this process (engine.run_step, as a worker's
slice runs it) and the process's CPU time (time.process_time: this process only, not PostgreSQL's) is divided by
the steps; also the Python function calls per step, counted by cProfile in one more run — a figure that does not
vary between runs, so a change of a few calls per step shows even where the CPU figure's noise hides it.

With ``--against DIR`` (another checkout, e.g. `git worktree add /tmp/before <rev>`), the same measurement runs in
that checkout's code too, interleaved with this one's (this, that, that, this, …), each on a scratch database of
its own migrated by its own code, and the table gives both and their ratio. The fleet benchmark's worker CPU per
step (bench/engine.py) swings by ±30 % between runs of the same code on a 2-core machine; this one by a few
percent: the place to show that a hook on the step path costs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(*, steps: int, repeat: int) -> dict:
    """In this process (the code of the checkout on sys.path): CPU ms per step of each run, calls per step."""
    import cProfile
    import pstats

    import django

    django.setup()
    sys.path.insert(0, str(ROOT))  # (bench.scratch, whichever checkout's code runs)
    from bench.scratch import scratch_database
    from tasks_app.engine.slice import run_step
    from tasks_app.models import Task
    from tasks_app.services import task_create

    def one(tenant) -> None:
        task = task_create(tenant=tenant, owner=None, workflow="demo_steps",
                           input={"steps": steps, "effect": True}).task
        while Task.objects.values_list("status", flat=True).get(id=task.id) not in ("completed", "failed",
                                                                                     "dead_lettered"):
            run_step(task.id, owner="step-cpu")

    with scratch_database("step_cpu") as tenant:
        one(tenant)  # warm-up: imports, prepared statements, caches
        runs = []
        for _ in range(repeat):
            started = time.process_time()
            one(tenant)
            runs.append((time.process_time() - started) * 1000 / steps)
        profile = cProfile.Profile()
        profile.enable()
        one(tenant)
        profile.disable()
        calls = pstats.Stats(profile).total_calls
    return {"cpu_ms_per_step": [round(run, 4) for run in runs], "calls_per_step": round(calls / steps, 1)}


def run_in(checkout: Path, *, steps: int, repeat: int) -> dict:
    """measure() in a process of its own running ``checkout``'s code (this file's function, that tree's engine)."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "STEP_CPU_ROOT": str(checkout)}
    done = subprocess.run([sys.executable, __file__, "--measure", "--steps", str(steps), "--repeat", str(repeat)],
                          cwd=checkout, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the measurement in {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="with --against: interleaved rounds")
    parser.add_argument("--against", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        global ROOT
        ROOT = Path(os.environ.get("STEP_CPU_ROOT", ROOT))
        print(json.dumps(measure(steps=args.steps, repeat=args.repeat)))
        return
    checkouts = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
    results: dict[str, list[dict]] = {name: [] for name in checkouts}
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for round_ in range(args.rounds if args.against else 1):
        order = list(checkouts) if round_ % 2 == 0 else list(reversed(checkouts))
        for name in order:
            results[name].append(run_in(checkouts[name], steps=args.steps, repeat=args.repeat))
            print(f"[step-cpu] round {round_ + 1}: {name} {results[name][-1]}", file=sys.stderr, flush=True)
    summary = {}
    for name, runs in results.items():
        cpu = [value for run in runs for value in run["cpu_ms_per_step"]]
        summary[name] = {"checkout": str(checkouts[name]), "cpu_ms_per_step_median": round(statistics.median(cpu), 4),
                         "cpu_ms_per_step_min": round(min(cpu), 4), "cpu_ms_per_step_max": round(max(cpu), 4),
                         "calls_per_step": runs[-1]["calls_per_step"], "runs": runs}
    print(f"\n{started} UTC · demo_steps, one effect per step · {args.steps} steps × {args.repeat} runs"
          f"{f' × {args.rounds} interleaved rounds' if args.against else ''} · load average at end "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}\n")
    print("| checkout | CPU ms/step, median [min–max] | Python calls/step |")
    print("|---|---|---|")
    for name, row in summary.items():
        print(f"| {name} ({row['checkout']}) | {row['cpu_ms_per_step_median']} [{row['cpu_ms_per_step_min']}–"
              f"{row['cpu_ms_per_step_max']}] | {row['calls_per_step']} |")
    if args.against:
        this, other = summary["this"], summary["against"]
        print(f"\nthis / against: CPU {this['cpu_ms_per_step_median'] / other['cpu_ms_per_step_median']:.3f}, "
              f"calls {this['calls_per_step'] / other['calls_per_step']:.3f}")
    print(json.dumps({"scenario": "step_cpu", "args": {k: str(v) for k, v in vars(args).items()}, "results": summary}))


if __name__ == "__main__":
    main()
