"""What a directory given as a target is when it holds no vLLM, said with what a target should be: a
venv's root, an empty directory or the ``vllm`` package itself is a likely slip, and "vLLM (unknown
version)" would send its user looking for a line instead of the right directory."""

from __future__ import annotations

from pathlib import Path

SHOULD_BE = ("a target is the directory holding the vllm/ package: a vLLM git checkout or source tree, or a "
             "site-packages directory where vLLM is installed ('--target site-packages' for this interpreter's); "
             "or give '--python EXE' for the vLLM an interpreter has installed")


def not_vllm(root: Path) -> str | None:
    """Why `root` cannot be a vLLM target, with what to give instead; None when it holds a ``vllm/`` package."""
    if (root / "vllm").is_dir():
        return None
    if root.name == "vllm" and (root / "__init__.py").is_file():
        what = f"is the vllm package itself; give the directory holding it: --target {root.parent}"
    elif (root / "pyvenv.cfg").is_file():
        python = root / "Scripts" / "python.exe" if (root / "Scripts").is_dir() else root / "bin" / "python"
        what = f"is a virtual environment's root; give its interpreter: --python {python}"
    elif not any(root.iterdir()):
        what = "is an empty directory"
    elif any(root.glob("*.dist-info")):
        what = "is a directory of installed packages without vLLM"
    else:
        what = "holds no vllm/ package"
    return f"{root} {what}; {SHOULD_BE}"
