"""scripts/async_summary.py on a resumed run: only the last process's rows give its wall time."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_summary", ROOT / "scripts" / "async_summary.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_resumed_run_is_timed_over_its_last_process(tmp_path: Path) -> None:
    # killed after RL step 4 (times 60..64 s of the first process), resumed at step 5: the second
    # process's clock starts again (40 s at step 5, then 0.5 s a step)
    rows = [{"phase": "rl", "step": k, "time": 60.0 + k} for k in range(5)]
    rows += [{"phase": "eval", "step": 5, "time": 65.0, "eval_accuracy": 0.5}]
    rows += [{"phase": "rl", "step": k, "time": 40.0 + 0.5 * (k - 5)} for k in range(5, 50)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"rl": {"prompts_per_step": 2, "samples_per_prompt": 5}})
    )
    s = _script().summary(tmp_path)
    assert s["rl_steps"] == 45
    assert abs(s["s_per_sample"] - 0.5 / 10) < 1e-12  # 0.5 s a step over 10 samples, not negative
