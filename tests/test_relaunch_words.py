"""Recorded arguments of every kind reach the relaunched program unchanged: spaces, quotes, shell
characters, a line break, a character past U+FFFF (an emoji), DEL, a word too long for a file name. relaunch.yaml used to break on
them: a line break ended the header's comment (the rest read as YAML: not a spec), DEL is refused by
YAML, and an emoji came back as two lone surrogates no command line can carry (internal error). A
real program under the real capture helper (torch, CPU), the real analyze and `zoomer-ar relaunch`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from zoomer_ar.cli import main
from zoomer_ar.relaunch import load_spec

PROGRAM = '''
import json, sys
import torch
from zoomer_ar.capture import SteadyStateProfiler

out, *rest = sys.argv[1:]
with SteadyStateProfiler(out, skip_first=0, warmup=1, active=1) as prof:
    while not prof.done:
        torch.randn(8, 8).sum()
        prof.step()
with open("received.json", "w", encoding="utf-8") as fh:
    json.dump(rest, fh)
'''

#: a config given as one JSON argument, past any file name's length (ENAMETOOLONG when taken for a path)
LONG = "--config=" + json.dumps({f"key{i}": "v" * 20 for i in range(200)})
WORDS = ["--tag", "it's \"quoted\" $HOME `id` é 日本", "hi 😀", "two\nlines", "del\x7f", "--x=a b", "", "#c", LONG,
         "a/" + "y" * 300]


def _env() -> dict[str, str]:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def test_recorded_words_reach_the_relaunched_program_unchanged(tmp_path, capsys):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(PROGRAM)
    first = subprocess.run([sys.executable, "train.py", "traces/before", *WORDS], cwd=proj, env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads((proj / "received.json").read_text(encoding="utf-8")) == WORDS

    assert main(["analyze", str(proj / "traces" / "before"), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    capsys.readouterr()
    text = (tmp_path / "o" / "relaunch.yaml").read_text(encoding="utf-8")
    assert isinstance(yaml.safe_load(text), dict)  # the header's comment stayed comment
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    assert spec.command.args == ["traces/before-relaunch", *WORDS]

    (proj / "received.json").unlink()
    done = subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(tmp_path / "o" / "relaunch.yaml")],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((proj / "received.json").read_text(encoding="utf-8")) == WORDS


def test_a_spec_written_with_a_surrogate_pair_still_runs(tmp_path):
    """relaunch.yaml of an earlier zoomer-ar wrote an emoji as JSON's surrogate pair ("\\ud83d\\ude00"):
    it is read as the emoji again, not two lone surrogates."""
    (tmp_path / "echo.py").write_text("import json, sys\nopen('got.json', 'w').write(json.dumps(sys.argv[1:]))\n")
    (tmp_path / "relaunch.yaml").write_text(
        f'schema_version: "1.2"\njob: "j"\ncwd: {json.dumps(str(tmp_path))}\ncommand:\n'
        f'  python: {json.dumps(sys.executable)}\n  script: "echo.py"\n  args: ["hi \\ud83d\\ude00"]\n')
    done = subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(tmp_path / "relaunch.yaml")],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "got.json").read_text()) == ["hi 😀"]
