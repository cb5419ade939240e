"""The outlook and the rename-following rebase on the real vLLM sdists (0.20.0, 0.20.2,
0.21.0, 0.22.0, 0.31.0, 0.33.0 from PyPI; downloaded once into the cache, sha256-checked).
The project's series here is release line v0.20's (lines/v0.20, pinned to 0.20.0)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers import run_cli, snapshot
from realvllm import GDN, GDN_LAYER, make_series, replace_once
from vllm_patch.lifecycle.obsolete import conditions
from vllm_patch.lines import line_named
from vllm_patch.series import load_series

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
LINE = "v0.20"
V020 = ("--line", LINE)  # the project's 0.20 line, whichever line is current
QWEN_GDN = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
FLA_OLD = "vllm/model_executor/layers/fla/ops/fused_recurrent.py"
FLA_NEW = "vllm/third_party/flash_linear_attention/ops/fused_recurrent.py"
TURBOQUANT = "vllm/v1/attention/backends/turboquant_attn.py"
TREE_ATTN = "vllm/v1/attention/backends/tree_attn.py"  # deleted in 0.21.0, no successor
# 0.22.0 changed the line 3 lines above this one (get_state_shape's signature), not its neighbours:
# a patch of it needs the 3-way merge, at the file's new path.
MERGE_LINE = "            self.num_k_heads,\n"
SIGNATURE = "    def get_state_shape(self) -> tuple[tuple[int, ...], tuple[int, ...]]:\n"


def outlook_json(*args: str, series: Path | None = None) -> dict:
    where = ("--series", str(series)) if series else V020
    result = run_cli(*where, "outlook", "--json", *args, cwd=PROJECT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cells(data: dict, version: str) -> tuple[dict, dict]:
    row = next(r for r in data["releases"] if r["version"] == version)
    return row["moves"], {name[:4]: cell for name, cell in row["patches"].items()}


def test_outlook_of_the_v0_20_line_on_0_21_and_0_33():
    data = outlook_json("--releases", "0.21.0,0.31.0,0.33.0")
    assert [r["version"] for r in data["releases"]] == ["0.21.0", "0.31.0", "0.33.0"]
    moves, c = cells(data, "0.21.0")
    assert moves == {"moved": {}, "similarity": {}, "gone": []}
    assert c["0001"]["stacked"]["state"] == "conflict"
    assert TURBOQUANT in c["0001"]["stacked"]["conflicts"] and c["0001"]["stacked"]["regions"] >= 1
    assert c["0004"]["stacked"]["state"] == "clean" and c["0006"]["stacked"]["state"] == "clean"
    moves, c = cells(data, "0.33.0")
    assert moves["moved"] == {GDN_LAYER: QWEN_GDN, FLA_OLD: FLA_NEW} and moves["gone"] == []
    assert 30 <= moves["similarity"][GDN_LAYER] < 50 and moves["similarity"][FLA_OLD] >= 90
    for n in ("0001", "0002", "0003"):
        assert c[n]["stacked"]["state"] == "conflict" and c[n]["alone"]["state"] == "conflict"
    if c["0004"]["alone"]["state"] != "obsolete":
        assert c["0004"]["alone"]["moved"] == {GDN_LAYER: QWEN_GDN, FLA_OLD: FLA_NEW}


def test_obsolete_cells_follow_the_trailers_on_0_31_and_0_33():
    """Checks whatever the patches' Obsolete-If trailers say: a patch is obsolete exactly where
    it carries such trailers and they hold. NOTE: the last assertion (0004-0006 obsolete on
    0.33, 0001-0003 not) passes once the trailers are in patches 0004-0006."""
    series = line_named(Path(os.environ.get("VLLM_PATCH_SERIES") or PROJECT), LINE).load()  # what the CLI reads too
    data = outlook_json("--releases", "0.31.0,0.33.0")
    for version in ("0.31.0", "0.33.0"):
        _, c = cells(data, version)
        for patch in series.patches:
            cell = c[patch.name[:4]]
            assert (cell["stacked"]["state"] == "obsolete") == (cell["alone"]["state"] == "obsolete")
            if not conditions(patch):
                assert cell["stacked"]["state"] != "obsolete", (version, patch.name)
            if cell["stacked"]["state"] == "obsolete":
                assert all(f"Obsolete-If: {cond.source}" in cell["stacked"]["reason"] for cond in conditions(patch))
    _, c31 = cells(data, "0.31.0")
    assert not [n for n, cell in c31.items() if cell["stacked"]["state"] == "obsolete"]
    _, c33 = cells(data, "0.33.0")
    assert {n for n, cell in c33.items() if cell["stacked"]["state"] == "obsolete"} == {"0004", "0005", "0006"}


def series_files() -> tuple[dict[str, bytes], ...]:
    """The project's series files: line v0.20's, and the current line's."""
    top = {"series": (PROJECT / "series").read_bytes()}
    return snapshot(PROJECT / "lines" / LINE), snapshot(PROJECT / "patches"), top


def test_outlook_markdown_and_table(tmp_path):
    before = series_files()
    report = tmp_path / "outlook.md"
    result = run_cli(*V020, "outlook", "--to", "0.20.2", "--markdown", str(report), cwd=PROJECT)
    assert result.returncode == 0, result.stderr
    assert "0.20.1" in result.stdout and "✓ clean" in result.stdout
    text = report.read_text()
    assert text.startswith("### vllm-patch outlook") and "| 0.20.2 |" in text and "| 0.20.0 |" in text
    assert before == series_files()


def copy_series(dest: Path) -> Path:
    dest.mkdir(parents=True)
    shutil.copy2(PROJECT / "lines" / LINE / "series", dest / "series")
    shutil.copytree(PROJECT / "lines" / LINE / "patches", dest / "patches")
    return dest


def test_rebase_of_the_real_series_to_0_20_2_is_clean_with_a_complete_pin(tmp_path):
    root = copy_series(tmp_path / "s")
    result = run_cli("--series", str(root), "rebase", "v0.20.2", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {p["step"] for p in data["patches"]} == {"clean"}
    text = (root / "series").read_text()
    assert "#: version = 0.20.2\n#: tag = v0.20.2\n#: commit = bc150f502\n" in text
    assert "vllm-0.20.2.tar.gz sha256:58809377798c5335c6e2fe30092abda54d9200b5b8a717b3735a63f5daa0e383" in text
    assert re.search(r"#: wheel = vllm-0\.20\.2-cp38-abi3-manylinux_2_35_x86_64\.whl sha256:[0-9a-f]{64}", text)
    assert "short id" in text and "0.20.0" not in text.split("#: version")[0].split("Rebased from")[0]
    assert "Rebased from vLLM 0.20.0 onto 0.20.2" in text
    check = run_cli("--series", str(root), "check")
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture
def rename_series(sdist_tree, tmp_path) -> Path:
    """Two patches of the real 0.20.0: one merges in gdn_linear_attn.py once it follows it to
    its 0.22.0 path, one edits gdn_attn.py (clean)."""
    base = {p: (sdist_tree / p).read_bytes() for p in (GDN_LAYER, GDN)}
    layer = replace_once(base[GDN_LAYER], MERGE_LINE, MERGE_LINE.rstrip("\n") + "  # vllm-patch rename test\n")
    gdn = replace_once(base[GDN], "    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]\n",
                       "    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]\n"
                       "    spec_decode_src_indices: torch.Tensor | None = None  # vllm-patch test\n")
    return make_series(tmp_path / "series", base, [("GDN layer: follows the move", {GDN_LAYER: layer}),
                                                   ("GDN: clean", {GDN: gdn})])


def test_rebase_follows_a_rename_and_merges_there(rename_series):
    s = ("--series", str(rename_series))
    result = run_cli(*s, "rebase", "v0.22.0", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [p["step"] for p in data["patches"]] == ["merged", "clean"]
    assert data["patches"][0]["moved"] == {GDN_LAYER: QWEN_GDN}
    name = load_series(rename_series).names[0]
    text = (rename_series / "patches" / name).read_text()
    assert f"diff --git a/{QWEN_GDN} b/{QWEN_GDN}" in text and GDN_LAYER not in text.split("diff --git", 1)[1]
    assert "+            self.num_k_heads,  # vllm-patch rename test" in text
    assert run_cli(*s, "check").returncode == 0


@pytest.fixture
def conflict_series(sdist_tree, tmp_path) -> Path:
    """One patch of the real 0.20.0 that changes a line of gdn_linear_attn.py that 0.22.0 also
    changed (after the move), plus a file 0.21.0 deleted."""
    base = {p: (sdist_tree / p).read_bytes() for p in (GDN_LAYER,)}
    layer = replace_once(base[GDN_LAYER], SIGNATURE, SIGNATURE.replace("-> tuple", "-> tuple  # vp", 1))
    return make_series(tmp_path / "series", base, [("GDN layer: conflicts after the move", {GDN_LAYER: layer})])


def test_resolution_resurrecting_a_moved_file_or_with_an_undefined_name_is_refused(conflict_series):
    s = ("--series", str(conflict_series))
    before = snapshot(conflict_series)
    first = run_cli(*s, "rebase", "v0.22.0", "--json")
    assert first.returncode == 1, first.stderr
    data = json.loads(first.stdout)
    assert data["patches"][0]["step"] == "conflict" and data["patches"][0]["moved"] == {GDN_LAYER: QWEN_GDN}
    work = Path(data["work_dir"])
    assert (work / QWEN_GDN).is_file() and not (work / GDN_LAYER).exists()
    assert (work.parent / "reference/old-patched" / GDN_LAYER).is_file()
    # Resolve the markers by taking the new base's side ...
    merged = (work / QWEN_GDN).read_text()
    resolved = re.sub(r"<<<<<<< [^\n]*\n(.*?)\|\|\|\|\|\|\| .*?=======\n.*?>>>>>>> [^\n]*\n|"
                      r"<<<<<<< [^\n]*\n(.*?)=======\n.*?>>>>>>> [^\n]*\n",
                      lambda m: m.group(1) or m.group(2) or "", merged, flags=re.S)
    assert "<<<<<<<" not in resolved
    # ... but also bring the old path back: refused, the message says where it went.
    (work / GDN_LAYER).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(work.parent / "reference/old-patched" / GDN_LAYER, work / GDN_LAYER)
    (work / QWEN_GDN).write_text(resolved)
    refused = run_cli(*s, "rebase", "--continue")
    assert refused.returncode == 2 and f"re-creates {GDN_LAYER}" in refused.stderr
    assert QWEN_GDN in refused.stderr and "--allow-new-file" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    (work / GDN_LAYER).unlink()
    # An undefined name in the resolution: refused, naming file:line.
    lines = resolved.split("\n")
    at = lines.index(MERGE_LINE.rstrip("\n")) + 1
    lines.insert(at - 1, "            vp_undefined_name_xyz,")
    (work / QWEN_GDN).write_text("\n".join(lines))
    refused = run_cli(*s, "rebase", "--continue")
    assert refused.returncode == 2
    assert re.search(rf"{re.escape(QWEN_GDN)}:{at}: undefined name 'vp_undefined_name_xyz'", refused.stderr)
    # A resolution that keeps the patch's intent goes through, and refreshes the patch from it.
    (work / QWEN_GDN).write_text(resolved.replace(MERGE_LINE, MERGE_LINE.rstrip("\n") + "  # vp resolved\n", 1))
    done = run_cli(*s, "rebase", "--continue", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["patches"][0]["step"] == "merged"
    patch = next((conflict_series / "patches").glob("*.patch")).read_text()
    assert f"+++ b/{QWEN_GDN}" in patch and "+            self.num_k_heads,  # vp resolved" in patch
    assert snapshot(conflict_series) != before


def test_skip_drops_the_stopped_patch_with_its_reason(conflict_series):
    s = ("--series", str(conflict_series))
    assert run_cli(*s, "rebase", "v0.22.0").returncode == 1
    skipped = run_cli(*s, "rebase", "--skip", "--reason", "ported by hand later", "--json")
    assert skipped.returncode == 0, skipped.stderr
    assert json.loads(skipped.stdout)["patches"][0]["step"] == "dropped"
    log = (conflict_series / "dropped-patches").read_text()
    assert "Dropped-By-Hand: rebasing onto v0.22.0" in log and "ported by hand later" in log
    assert "#: version = 0.22.0" in (conflict_series / "series").read_text()
    assert not list((conflict_series / "patches").glob("*.patch"))


def test_a_file_deleted_upstream_is_a_conflict_that_says_so(sdist_tree, tmp_path):
    base = {p: (sdist_tree / p).read_bytes() for p in (TREE_ATTN, GDN)}
    tree_attn = base[TREE_ATTN].replace(b"\n", b"  # vp\n", 1)
    gdn = replace_once(base[GDN], "    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]\n",
                       "    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]  # vp\n")
    root = make_series(tmp_path / "series", base, [("touches a file 0.21 deleted", {TREE_ATTN: tree_attn, GDN: gdn})])
    first = run_cli("--series", str(root), "rebase", "v0.21.0", "--json")
    assert first.returncode == 1
    data = json.loads(first.stdout)
    assert data["patches"][0]["gone"] == [TREE_ATTN]
    assert f"{TREE_ATTN} was deleted upstream in v0.21.0" in first.stderr
    work = Path(data["work_dir"])
    assert not (work / TREE_ATTN).exists() and (work / GDN).is_file()
    out = outlook_json("--releases", "0.21.0", series=root)
    assert out["releases"][0]["patches"][load_series(root).names[0]]["stacked"]["state"] == "gone"
    # Leaving the deleted file out keeps the rest of the patch.
    done = run_cli("--series", str(root), "rebase", "--continue", "--json")
    assert done.returncode == 0, done.stderr
    text = next((root / "patches").glob("*.patch")).read_text()
    assert GDN in text and TREE_ATTN not in text


def test_interrupted_outlook_leaves_the_series_as_it_was(tmp_path):
    root = copy_series(tmp_path / "s")
    before = snapshot(root)
    proc = subprocess.Popen([sys.executable, "-m", "vllm_patch", "--series", str(root), "outlook",
                             "--to", "0.33.0", "--markdown", str(root / "report.md")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    after = snapshot(root)
    after.pop("report.md", None)  # written whole (renamed into place) or not at all
    assert after == before


class _Index(BaseHTTPRequestHandler):
    body = b"not the real sdist"
    files: list[dict] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.rstrip("/").endswith("/simple/vllm"):
            data = json.dumps({"meta": {"api-version": "1.0"}, "name": "vllm", "files": self.files}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        else:
            data = self.body
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    unknown = run_cli("outlook", "--releases", "0.99.0", cwd=PROJECT)
    assert unknown.returncode == 2 and "0.99.0" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    bad = run_cli("outlook", "--releases", "latest", cwd=PROJECT)
    assert bad.returncode == 2 and "unknown tag" in bad.stderr
    # No network, empty cache.
    offline = {"VLLM_PATCH_CACHE": str(tmp_path / "empty"), "VLLM_PATCH_INDEX_URL": "http://127.0.0.1:9/simple"}
    for args in (("outlook",), ("outlook", "--releases", "0.21.0"), ("rebase", "v0.21.0")):
        result = run_cli(*V020, *args, cwd=PROJECT, env=offline)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    # An index whose sha256 for the sdist does not match what it serves.
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    port = server.server_address[1]
    _Index.files = [{"filename": f"vllm-{v}.tar.gz", "url": f"http://127.0.0.1:{port}/files/vllm-{v}.tar.gz",
                     "hashes": {"sha256": "0" * 64}} for v in ("0.20.0", "0.21.0")]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"VLLM_PATCH_CACHE": str(tmp_path / "c2"), "VLLM_PATCH_INDEX_URL": f"http://127.0.0.1:{port}/simple"}
        result = run_cli(*V020, "outlook", "--releases", "0.21.0", cwd=PROJECT, env=env)
    finally:
        server.shutdown()
    assert result.returncode == 2 and "sha256" in result.stderr and "does not match" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
