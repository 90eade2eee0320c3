"""The AR section's Python example (AR.md, merged into the package README) runs as written."""

import re
from pathlib import Path


def test_ar_md_example_runs() -> None:
    text = (Path(__file__).resolve().parents[1] / "AR.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "AR.md has no python example"
    for code in blocks:
        exec(compile(code, "AR.md", "exec"), {})
