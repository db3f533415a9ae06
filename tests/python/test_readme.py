"""The README's Python block (after `<!-- readme-python -->`) runs as written against the daemon,
with nothing but PUBSUB_EMULATOR_HOST set, and prints what its comment says."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- readme-python -->"


def readme_block():
    text = README.read_text()
    assert MARKER in text, f"README.md has no block marked {MARKER}"
    after = text.split(MARKER, 1)[1]
    match = re.match(r"\s*```python\n(.*?)```", after, re.DOTALL)
    assert match, f"the marker {MARKER} is not followed by a ```python block"
    return match.group(1)


def test_the_readmes_python_block_runs_as_written(daemon):
    # `daemon` has set PUBSUB_EMULATOR_HOST; the block makes its own clients, as a user's would.
    block = readme_block()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    assert printed.getvalue().strip() == "[b'invoice 1']", printed.getvalue()
