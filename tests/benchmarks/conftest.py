"""Tests of the benchmarks' own code (benchmarks/): their modules import by name, and their Triton kernels run on
CPU under the interpreter where no GPU is (set before any kernel is defined)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
