"""``vllm-patch doctor``, the install part, on a fake vLLM in a throwaway interpreter's site-packages (no GPU
here): the line and each patch's state, the one command that fixes it, the guard, the environment the line
reads, the interpreter's torch and the "no GPU" line; the JSON holds no path of this machine but the one
given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from doctor_support import absolute_paths

from helpers import VERSION_PY, build_series, edit, make_site_packages
from vllm_patch.cli import main
from vllm_patch.doctor import geometry
from vllm_patch.doctor.render import Scrubber
from vllm_patch.errors import InputError
from vllm_patch.series import load_series

KERNEL = "vllm/v1/attention/ops/triton_turboquant_verify.py"
ENVS = b'import os\n\nenvironment_variables = {\n    "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),\n}\n'


@pytest.fixture
def line(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A one-line project pinned to 0.20.0 whose patch reads two variables and adds the kernel's file."""
    base = {"vllm/_version.py": VERSION_PY, "vllm/envs.py": ENVS}
    added = b"".join(f'    "{name}": lambda: os.getenv("{name}"),\n'.encode()
                     for name in ("VLLM_TURBOQUANT_ATTENTION_KERNEL", "VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY"))
    envs = edit(ENVS, b"}\n", added + b"}\n")
    series = build_series(tmp_path / "project", base,
                          [("the kernel", {"vllm/envs.py": envs, KERNEL: b"KERNEL = 1\n"})])
    return series, base


def doctor(series: Path, *args: str):
    return CliRunner().invoke(main, ["--series", str(series), "doctor", *args])


def install_guard(site: Path, series: Path) -> None:
    dist = site / "vllm_patch_guard-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-patch-guard\nVersion: 0.1.0\n")
    (site / "vllm_patch_guard").mkdir()
    lines = [{"name": "current", "digest": load_series(series).digest}]
    (site / "vllm_patch_guard" / "lines.json").write_text(json.dumps({"lines": lines}))


def test_install_part_json_then_applied_then_no_torch(line, fake_python, monkeypatch):
    series, base = line
    python, site = fake_python
    make_site_packages(site, base)
    install_guard(site, series)
    monkeypatch.setenv("VLLM_PATCH_GUARD", "strict")
    monkeypatch.setenv("VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY", "65536")
    monkeypatch.delenv("VLLM_TURBOQUANT_ATTENTION_KERNEL", raising=False)

    # Not applied: exit 1, the fix named, everything else still reported.
    result = doctor(series, "--python", str(python), "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    for key in ("doctor", "vllm_patch", "exit_code", "verdict", "given", "install", "runtime", "gpus", "no_gpu",
                "model", "routes", "check", "timing", "errors"):
        assert key in data, key
    inst = data["install"]
    assert inst["vllm"]["version"] == "0.20.0" and inst["line"] == "current" and inst["verdict"] == "applies"
    assert [p["state"] for p in inst["patches"]] == ["applies"] and not inst["fully_applied"]
    assert inst["fix"] == f"vllm-patch apply --python {python}" and inst["fix"] in data["verdict"]
    assert inst["guard"] == {"installed": True, "version": "0.1.0", "knows_series": True, "mode": "strict",
                             "env": "strict"}
    assert inst["env"] == {"VLLM_TURBOQUANT_ATTENTION_KERNEL": None, "VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY": "65536",
                           "VLLM_PATCH_GUARD": "strict"}
    assert not inst["kernel_installed"] and data["skipped"]
    assert data["runtime"]["torch"] and data["runtime"]["triton"] and data["runtime"]["python"]
    assert data["gpus"] == [] and data["exit_code"] == 1
    assert data["no_gpu"] == f"no GPU visible to {python} (torch.cuda.is_available() is False)"
    assert set(absolute_paths(data)) == {str(python)}, "the JSON names a path of this machine beyond --python"

    assert CliRunner().invoke(main, ["--series", str(series), "apply", "--python", str(python)]).exit_code == 0

    # Applied, no GPU: exit 0, one clear line about the GPU.
    result = doctor(series, "--python", str(python))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"no GPU visible to {python} (torch.cuda.is_available() is False)" in out
    assert "release line current" in out and "applied (1 of 1 patches applied)" in out
    assert "guard: vllm-patch-guard 0.1.0, knows this series; mode strict" in out
    assert "VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY='65536'" in out
    assert out.rstrip().endswith("OK: the line is applied; no kernel was checked (no GPU)")

    # The interpreter has no torch: the install is still shown, and the environment error is exit 2.
    (site / "zz_outer.pth").unlink()
    result = doctor(series, "--python", str(python))
    assert result.exit_code == 2, result.output
    assert "applied (1 of 1 patches applied)" in result.stdout and "No module named 'torch'" in result.stdout


def test_not_an_interpreter_is_exit_2(line, tmp_path):
    result = doctor(line[0], "--python", str(tmp_path / "nothing" / "python"))
    assert result.exit_code == 2 and "cannot ask" in result.stderr


def test_geometry_from_config_json(tmp_path):
    default = geometry.model(None)
    assert [(g.num_heads, g.num_kv_heads, g.head_dim, g.tp) for g in default.geometries] == [(24, 4, 256, 1),
                                                                                            (12, 2, 256, 2)]
    nested = tmp_path / "Qwen3.6-27B"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({
        "model_type": "qwen3_5", "num_attention_heads": 99,  # the wrapper's own, not the text model's
        "text_config": {"num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "dtype": "bfloat16",
                        "mtp_num_attention_heads": 16, "mtp_num_key_value_heads": 2}}))
    model = geometry.model(nested, (1, 2, 8))
    assert model.name == "Qwen3.6-27B" and model.dtype == "bfloat16"
    got = [(g.label, g.num_heads, g.num_kv_heads, g.head_dim, g.tp) for g in model.geometries]
    assert got == [("Qwen3.6-27B", 24, 4, 256, 1), ("Qwen3.6-27B", 12, 2, 256, 2), ("Qwen3.6-27B", 3, 1, 256, 8),
                   ("Qwen3.6-27B MTP", 16, 2, 256, 1), ("Qwen3.6-27B MTP", 8, 1, 256, 2),
                   ("Qwen3.6-27B MTP", 2, 1, 256, 8)]
    (nested / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "hidden_size": 2048,
                                                    "num_attention_heads": 16, "num_key_value_heads": 2}))
    assert [(g.num_heads, g.head_dim) for g in geometry.model(nested, (1,)).geometries] == [(16, 128)]
    (nested / "config.json").write_text('{"num_attention_heads": 6, "num_key_value_heads": 4, "head_dim": 64}')
    with pytest.raises(InputError, match="not an attention geometry"):
        geometry.model(nested)


def test_scrubber_keeps_given_paths_only():
    scrub = Scrubber({"/opt/env/lib/python3.12/site-packages": "<vllm>", "/home/me": "~"}, ["/opt/env/bin/python"])
    text = ("in the site-packages of /opt/env/bin/python: /opt/env/lib/python3.12/site-packages/vllm/x.py, "
            "/home/me/series, /home/mei/x, /srv/other/file.py")
    assert scrub(text) == "in the site-packages of /opt/env/bin/python: <vllm>/vllm/x.py, ~/series, <path>, <path>"
    assert scrub({"a": [text, 3, None]}) == {"a": [scrub(text), 3, None]}
