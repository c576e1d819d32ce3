"""matmul-precision reports only where its call cannot go after the file's leading imports; the
report then says what to do with the file as it is: where torch is imported after other code (a
function defined before `import torch`), inside a function or a block, the call goes right after that
import; only a file with no `import torch` at all is told to add one."""

from __future__ import annotations

import pytest

from zoomer_ar.fix.registry import load_registry

FIXER = {cls.name: cls for cls in load_registry().fixers}["matmul-precision"]
TRAIN = "model = Net().cuda()\nloss = model(x).sum()\nloss.backward()\n"


def _report(source: str) -> str:
    fixer = FIXER()
    matches = fixer.detect(source)
    assert len(matches) == 1 and not matches[0].fixable
    assert fixer.fix(source) == source
    return matches[0].message


def _after_line(source: str, line: int, text: str) -> str:
    """`source` with `text` inserted after its line `line`, at that line's indentation."""
    lines = source.splitlines(keepends=True)
    indent = lines[line - 1][: len(lines[line - 1]) - len(lines[line - 1].lstrip())]
    return "".join(lines[:line] + [indent + text + "\n"] + lines[line:])


@pytest.mark.parametrize(
    ("source", "line", "name", "where"),
    [
        # a function defined before `import torch`: the leading imports end before torch's
        ("def helper(x):\n    return x\n\n\nimport torch\n\n" + TRAIN, 5, "torch", "after other code"),
        ('import os\nos.environ["OMP_NUM_THREADS"] = "1"\nimport torch as th\n' + TRAIN, 3, "th", "after other code"),
        ("import os\n\n\ndef main():\n    import torch\n    model = Net().cuda()\n    model(x).sum().backward()\n\n\n"
         'if __name__ == "__main__":\n    main()\n', 5, "torch", "inside `main()`"),
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n" + TRAIN, 2, "torch", "inside a block"),
    ],
)
def test_torch_imported_where_the_call_is_not_inserted(source, line, name, where):
    message = _report(source)
    call = f'{name}.set_float32_matmul_precision("high")'
    assert "add `import torch`" not in message
    assert f"torch is imported at line {line}, {where}" in message
    assert f"add `{call}` right after that import" in message
    # the advice, taken, is a file the fixer has nothing more to say about
    assert FIXER().detect(_after_line(source, line, call)) == []


def test_a_file_without_import_torch_is_told_to_add_it():
    message = _report("from torch import nn\nmodel = nn.Linear(2, 2).cuda()\nloss = model(x).sum()\nloss.backward()\n")
    assert 'add `import torch` and `torch.set_float32_matmul_precision("high")` after the imports' in message
