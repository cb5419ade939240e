"""The kernel-test plumbing: loading vLLM files per tree without the ``vllm`` package, and the trees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_patch.operations import status
from vllm_patch.targets.tree import TreeTarget
from vllm_tree import load_module, package_name
from vllm_trees import line_series

pytestmark = pytest.mark.kernels

HERE = Path(__file__).resolve().parent / "support"  # vllm_tree
DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
STAGE2 = "vllm/v1/attention/ops/triton_decode_attention.py"
STORE = "vllm/v1/attention/ops/triton_turboquant_store.py"
CONV = "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"
CONFIG = "vllm/model_executor/layers/quantization/turboquant/config.py"


def small_tree(root: Path, tag: str) -> Path:
    """A tree whose module imports a sibling three ways (from-import, ``import ... as``, lazily) and a shim."""
    pkg = root / "vllm" / "ops"
    pkg.mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("raise ImportError('the vllm package must not be run')\n")
    (pkg / "__init__.py").write_text("raise ImportError('package __init__ files must not be run')\n")
    (pkg / "dep.py").write_text(f"TAG = {tag!r}\n")
    (pkg / "kernel.py").write_text(
        "from vllm.ops.dep import TAG\n"
        "import vllm.ops.dep as dep_module\n"
        "from vllm.platforms import current_platform\n"
        "from vllm.v1.attention.backends.utils import NULL_BLOCK_ID, PAD_SLOT_ID\n"
        "\n"
        "def lazy_tag():\n"
        "    from vllm.ops import dep\n"
        "    return dep.TAG\n")
    return root


def test_two_trees_side_by_side(tmp_path):
    a = load_module(small_tree(tmp_path / "a", "A"), "vllm/ops/kernel.py")
    b = load_module(small_tree(tmp_path / "b", "B"), "vllm/ops/kernel.py")
    assert (a.TAG, a.dep_module.TAG, a.lazy_tag()) == ("A", "A", "A")
    assert (b.TAG, b.dep_module.TAG, b.lazy_tag()) == ("B", "B", "B")
    assert a is not b and a.__name__ != b.__name__
    assert (a.PAD_SLOT_ID, a.NULL_BLOCK_ID) == (-1, 0)
    assert a.current_platform.is_rocm() is False
    assert a is load_module(tmp_path / "a", "vllm/ops/kernel.py")
    assert a.__name__.startswith(package_name(tmp_path / "a") + ".vllm.")


def test_bad_paths_are_refused(tmp_path):
    small_tree(tmp_path / "t", "T")
    for rel in ("vllm/ops/kernel", "ops/kernel.py", "/vllm/ops/kernel.py", "vllm/../vllm/ops/kernel.py"):
        with pytest.raises(ValueError):
            load_module(tmp_path / "t", rel)
    with pytest.raises(FileNotFoundError):
        load_module(tmp_path / "nothing", "vllm/ops/kernel.py")
    with pytest.raises(ModuleNotFoundError):
        load_module(tmp_path / "t", "vllm/ops/missing.py")


def test_real_kernels_load_without_the_vllm_package(pristine_tree):
    """In a fresh interpreter: loading the kernel modules imports no ``vllm`` module (only tree copies)."""
    script = (
        "import sys, vllm_tree\n"
        f"for rel in {[DECODE, STORE, CONV, CONFIG]!r}:\n"
        f"    vllm_tree.load_module({str(pristine_tree)!r}, rel)\n"
        "bad = [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')]\n"
        "assert not bad, bad\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_real_kernels_load_from_their_own_tree(pristine_tree, patched_tree):
    """Each tree's decode launcher uses its own tree's stage-2 kernel."""
    mods = {}
    for name, tree in (("pristine", pristine_tree), ("patched", patched_tree)):
        decode = load_module(tree, DECODE)
        stage2 = load_module(tree, STAGE2)
        assert decode._fwd_kernel_stage2 is stage2._fwd_kernel_stage2
        assert Path(decode.__file__).is_relative_to(tree.resolve())
        mods[name] = decode
    assert mods["pristine"] is not mods["patched"]
    assert mods["pristine"]._fwd_kernel_stage2 is not mods["patched"]._fwd_kernel_stage2


def test_patched_tree_carries_the_whole_series(patched_tree):
    outcome = status(TreeTarget(patched_tree), line_series())
    assert outcome.ok and outcome.analysis.verdict == "applied", outcome.analysis.reports
